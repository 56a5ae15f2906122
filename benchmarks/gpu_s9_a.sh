#!/usr/bin/env bash
# Session 9, first call: (1) qk_norm_rope at SAME-L / SA3 with the cheaper tanh (ex2 +
# rcp.approx, fma Taylor) against the session's first commit (ab/src); (2) attention: the
# table (scale folded into one fma a score) before / after, and one-tile variants (--s9);
# (3) SAME's own call (prologue apart: qk_norm_rope's DyT + the attention); (4) GPU tests.
source benchmarks/device_env.sh
BUDGET=570
for t in new old; do
  pp=$PWD/src; [ $t = old ] && pp=$PWD/ab/src
  PYTHONPATH=/tmp/site:$pp step 60 python3 benchmarks/qk_ab.py $t same-l-decoder sa3-dit wan1.3b-480p >> $OUT/qk_ab.log 2>&1
  PYTHONPATH=/tmp/site:$pp step 40 python3 benchmarks/qk_ab.py $t --fp32 same-l-decoder >> $OUT/qk_ab.log 2>&1
done
cat $OUT/qk_ab.log
step 150 python3 benchmarks/sweep_attention.py --s9 > $OUT/sweep_attention_s9.log 2>&1
cat $OUT/sweep_attention_s9.log
PYTHONPATH=/tmp/site:$PWD/ab/src step 60 python3 benchmarks/sweep_attention.py --table > $OUT/attn_table_before.log 2>&1
grep -h "table" $OUT/attn_table_before.log
step 60 python3 benchmarks/attn_prologue_ab.py > $OUT/attn_prologue_ab.log 2>&1
tail -8 $OUT/attn_prologue_ab.log
step 150 python3 -m pytest tests/test_attention.py tests/test_qk_norm_rope.py -p no:cacheprovider -q --tb=short -x > $OUT/pytest.log 2>&1
tail -5 $OUT/pytest.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
