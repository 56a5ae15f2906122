#!/usr/bin/env bash
# Session 14, seventh call: the cost ladder (+ the u32-pair stages) of Wan's QK arithmetic (benchmarks/wan_ladder.py).
source benchmarks/device_env.sh
BUDGET=200
cd benchmarks
step 90 python3 wan_ladder.py wan14b-480p wan14b-720p 2>&1 | grep -v Warn | tee $OUT/wan_ladder2.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
