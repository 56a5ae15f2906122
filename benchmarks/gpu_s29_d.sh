#!/usr/bin/env bash
# Session 29, call d: every attention test, randomized cases and the AOT package's GPU tests
# with the fp32 Gluon route.
source benchmarks/device_env.sh
BUDGET=560
step 200 python3 -m pytest -q tests/test_attention.py -p no:cacheprovider --tb=short > $OUT/pytest_attention.log 2>&1; tail -n 2 $OUT/pytest_attention.log
DITFUSE_FUZZ_N=100 step 120 python3 -m pytest -q tests/test_attention_fuzz.py -p no:cacheprovider --tb=short > $OUT/pytest_attn_fuzz.log 2>&1; tail -n 2 $OUT/pytest_attn_fuzz.log
step 120 python3 -m pytest -q tests/test_aot.py -k "gpu or attention" -p no:cacheprovider --tb=short > $OUT/pytest_aot_gpu.log 2>&1; tail -n 2 $OUT/pytest_aot_gpu.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
