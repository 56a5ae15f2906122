#!/usr/bin/env bash
# Session 9, fifth call: (1) attention with the key tiles' loads bounded by the query tile's
# band (k_end) instead of N, against the session's first commit (ab/src), twice each,
# alternating; (2) qk_norm_rope's per-token kernel with fewer heads a program (per-head
# norms: more, smaller programs for the last wave) x warps, at the shapes it serves.
source benchmarks/device_env.sh
BUDGET=560
for i in 1 2; do
  PYTHONPATH=/tmp/site:$PWD/ab/src step 50 python3 benchmarks/sweep_attention.py --table > $OUT/attn_table_before_$i.log 2>&1
  step 50 python3 benchmarks/sweep_attention.py --table > $OUT/attn_table_after_$i.log 2>&1
done
grep -H "table" $OUT/attn_table_*.log
step 300 python3 benchmarks/sweep_qk.py flux1-1024,flux2-1024,qwen-image-1328,hunyuan-video-544p,sa3-dit,same-l-decoder 2,4,8 bf16 table,/2,/4 > $OUT/sweep_qk_heads.log 2>&1
grep -v "^\s*$" $OUT/sweep_qk_heads.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
