#!/usr/bin/env bash
# Prepared in session 17 (not run: the session's device time was spent): the SAME-L decode end
# to end with the one-pass prologue (SAME's attention call 2-4% faster, logs/s17/j), bf16 and
# fp32, and the AdaLN GPU tests that call d cut by time, in full.
source benchmarks/device_env.sh
BUDGET=560
step 300 python3 -m ditfuse bench --e2e --models same-l --dtypes fp32,bf16 --out-dir $OUT/e2e_same > $OUT/e2e_same.log 2>&1; grep -E "same-l" $OUT/e2e_same.log | tail -12
step 200 python3 -m pytest tests/test_adaln.py -p no:cacheprovider -q --tb=short > $OUT/pytest_adaln.log 2>&1; tail -n 2 $OUT/pytest_adaln.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
