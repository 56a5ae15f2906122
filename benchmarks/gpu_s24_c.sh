#!/usr/bin/env bash
# Session 24, call c: the channels-last GroupNorm statistics programs x tile sizes.
source benchmarks/device_env.sh
BUDGET=300
cd benchmarks
step 200 python3 gn_cl_profile.py --sweep2 > $OUT/gn_cl_sweep2.log 2>&1; cat $OUT/gn_cl_sweep2.log | tail -8
echo "seconds used by the steps: $(( SECONDS - T0 ))"
