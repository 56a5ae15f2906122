#!/usr/bin/env bash
# Session 26, call b: the GPU tests with the kernel of call a's "ship" variant (running max from
# -FLT_MAX, constexpr head count, band test on the tile's column index): every attention test,
# the AOT package's GPU and attention tests, 100 randomized attention cases.
source benchmarks/device_env.sh
BUDGET=580
step 230 python3 -m pytest -q tests/test_attention.py -p no:cacheprovider --tb=short > $OUT/pytest_attention.log 2>&1; tail -n 2 $OUT/pytest_attention.log
step 150 python3 -m pytest -q tests/test_aot.py -k "gpu or attention" -p no:cacheprovider --tb=short > $OUT/pytest_aot_gpu.log 2>&1; tail -n 2 $OUT/pytest_aot_gpu.log
DITFUSE_FUZZ_N=100 step 150 python3 -m pytest -q tests/test_attention_fuzz.py -p no:cacheprovider --tb=short > $OUT/pytest_attn_fuzz.log 2>&1; tail -n 2 $OUT/pytest_attn_fuzz.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
