#!/usr/bin/env bash
# Session 16, call e: the AOT GPU tests and the randomized attention cases that call d's step
# time cut.
source benchmarks/device_env.sh
BUDGET=300
step 150 python3 -m pytest tests/test_aot.py -k gpu -p no:cacheprovider -q -rs --tb=short > $OUT/pytest_aot_gpu.log 2>&1; tail -n 3 $OUT/pytest_aot_gpu.log
DITFUSE_FUZZ_N=100 step 140 python3 -m pytest tests/test_attention_fuzz.py -p no:cacheprovider -q -x --tb=short > $OUT/pytest_attn_fuzz.log 2>&1; tail -n 2 $OUT/pytest_attn_fuzz.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
