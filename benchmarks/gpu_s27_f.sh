#!/usr/bin/env bash
# Session 27, call f: the AOT package's GPU tests whole (call c's step ran out of time after 5
# of 6) and the Gluon tests on the final code.
source benchmarks/device_env.sh
BUDGET=330
step 60 python3 -m pytest -q tests/test_attention_gluon.py -p no:cacheprovider --tb=short > $OUT/pytest_attention_gluon.log 2>&1; tail -n 2 $OUT/pytest_attention_gluon.log
step 260 python3 -m pytest -q tests/test_aot.py -k "gpu or attention" -p no:cacheprovider --tb=short -s > $OUT/pytest_aot_gpu.log 2>&1; grep -E "AOT|passed|failed" $OUT/pytest_aot_gpu.log | tail -12
echo "seconds used by the steps: $(( SECONDS - T0 ))"
