#!/usr/bin/env bash
# Session 14, fourth call: Wan QK against its access pattern (benchmarks/wan_pattern.py).
source benchmarks/device_env.sh
BUDGET=200
cd benchmarks
step 90 python3 wan_pattern.py wan14b-480p 2>&1 | grep -v Warn | tee $OUT/wan_pattern.log
step 60 python3 wan_pattern.py wan14b-480p --warps 4 2>&1 | grep -v Warn | grep rows | tee -a $OUT/wan_pattern.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
