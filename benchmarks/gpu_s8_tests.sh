#!/usr/bin/env bash
# Session 8, last call: the GPU tests the earlier calls' budgets cut short (AOT packages of
# the flat-row QK kernel launched on the GPU, attention with the prologue apart).
source benchmarks/device_env.sh
BUDGET=290
step 280 python3 -m pytest tests/test_aot.py tests/test_inspect.py tests/test_attention.py -p no:cacheprovider -q --tb=short -x -rs > $OUT/pytest.log 2>&1
tail -6 $OUT/pytest.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
