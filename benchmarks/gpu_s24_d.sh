#!/usr/bin/env bash
# Session 24, call d: GroupNorm kernel by kernel with the channels-last statistics table of
# call c (CL_STATS_PROGRAMS = 256); the channels-last statistics / apply warps.
source benchmarks/device_env.sh
BUDGET=300
cd benchmarks
step 120 python3 gn_cl_profile.py > $OUT/gn_cl_profile.log 2>&1; grep -v Warn $OUT/gn_cl_profile.log | tail -12
step 150 python3 gn_cl_profile.py --warps > $OUT/gn_cl_warps.log 2>&1; cat $OUT/gn_cl_warps.log | tail -8
echo "seconds used by the steps: $(( SECONDS - T0 ))"
