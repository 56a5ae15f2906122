#!/usr/bin/env bash
# Session 8, sixth call: the public QK call out of place and in place (calib_qk.py), bf16 and
# fp16; the QK-norm + RoPE and attention bench rows of the shipped code; the GPU tests.
source benchmarks/device_env.sh
BUDGET=560
step 60 python3 benchmarks/calib_qk.py wan14b-480p > $OUT/calib_qk.log 2>&1
step 40 python3 benchmarks/calib_qk.py --fp16 wan14b-480p >> $OUT/calib_qk.log 2>&1
grep -v "^copy" $OUT/calib_qk.log
step 130 python3 -m ditfuse bench --op qk_norm_rope --out-dir $OUT/bench_qk > $OUT/bench_qk.log 2>&1
grep -E "ditfuse-graph" $OUT/bench_qk.log | head -20
step 150 python3 -m ditfuse bench --op attention --out-dir $OUT/bench_attn > $OUT/bench_attn.log 2>&1
grep -E "ditfuse-graph|flex " $OUT/bench_attn.log | head -20
step 200 python3 -m pytest tests/test_attention.py tests/test_aot.py tests/test_inspect.py tests/test_fastpath.py tests/test_qk_norm_rope.py -p no:cacheprovider -q --tb=short -x -rs > $OUT/pytest.log 2>&1
tail -4 $OUT/pytest.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
