#!/usr/bin/env bash
# Session 21, fourth call: register caps for the GroupNorm split path and the channel RMS
# (gn_caps.py), then the GroupNorm / RMS tests on the GPU with the capped table.
source benchmarks/device_env.sh
BUDGET=400
step 200 python3 benchmarks/gn_caps.py > $OUT/gn_caps.log 2>&1; cat $OUT/gn_caps.log
step 150 python3 -m pytest tests/test_group_norm.py tests/test_norms_fuzz.py -p no:cacheprovider -q --tb=short -x > $OUT/pytest_gn.log 2>&1; tail -n 3 $OUT/pytest_gn.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
