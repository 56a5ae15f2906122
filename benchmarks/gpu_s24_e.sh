#!/usr/bin/env bash
# Session 24, call e: GroupNorm statistics programs of any tile count (not rounded up to a
# power of two), channels-first and channels-last.
source benchmarks/device_env.sh
BUDGET=200
cd benchmarks
step 150 python3 gn_cl_profile.py --tpp > $OUT/gn_tpp.log 2>&1; cat $OUT/gn_tpp.log | tail -8
echo "seconds used by the steps: $(( SECONDS - T0 ))"
