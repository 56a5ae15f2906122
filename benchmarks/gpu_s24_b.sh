#!/usr/bin/env bash
# Session 24, call b: GroupNorm + SiLU kernel by kernel, channels-first against channels-last;
# the channels-last launch table against overrides.
source benchmarks/device_env.sh
BUDGET=300
cd benchmarks
step 120 python3 gn_cl_profile.py > $OUT/gn_cl_profile.log 2>&1; cat $OUT/gn_cl_profile.log | tail -14
step 150 python3 gn_cl_profile.py --sweep > $OUT/gn_cl_sweep.log 2>&1; cat $OUT/gn_cl_sweep.log | tail -8
echo "seconds used by the steps: $(( SECONDS - T0 ))"
