#!/usr/bin/env bash
# Session 8, second call: (1) the flat-row QK kernel against the per-token / TMA kernels and
# the plain calibration kernel (calib_qk.py, Wan shapes, bf16 and fp32); (2) SAME's own
# attention call fused vs unfused (attn_prologue_ab.py); (3) the attention table A/B against
# the session's first commit (ab/: the band as one unsigned compare, exp2 as ex2.ftz);
# (4) the QK / attention / fast-path tests on the GPU.
source benchmarks/device_env.sh
BUDGET=540
step 150 python3 benchmarks/calib_qk.py wan14b-480p wan14b-720p wan1.3b-480p > $OUT/calib_qk.log 2>&1
step 60 python3 benchmarks/calib_qk.py --fp32 wan14b-480p >> $OUT/calib_qk.log 2>&1
cat $OUT/calib_qk.log
step 120 python3 benchmarks/attn_prologue_ab.py > $OUT/attn_prologue_ab.log 2>&1
cat $OUT/attn_prologue_ab.log
if [ -d ab/src ]; then
  PYTHONPATH=/tmp/site:$PWD/ab/src step 60 python3 benchmarks/sweep_attention.py --table > $OUT/attn_table_before.log 2>&1
fi
step 60 python3 benchmarks/sweep_attention.py --table > $OUT/attn_table_after.log 2>&1
grep -h "table" $OUT/attn_table_before.log $OUT/attn_table_after.log
step 200 python3 -m pytest tests/test_qk_norm_rope.py tests/test_qk_tma.py tests/test_attention.py tests/test_fastpath.py -p no:cacheprovider -q --tb=short -x > $OUT/pytest.log 2>&1
tail -5 $OUT/pytest.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
