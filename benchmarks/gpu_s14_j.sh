#!/usr/bin/env bash
# Session 14, tenth call: the pair form with the table's pair index as a mask (a thread's
# heads share their table loads), the channel form with the same change (ditfuse-chan).
source benchmarks/device_env.sh
BUDGET=200
cd benchmarks
step 60 python3 wan_pattern.py wan14b-480p wan14b-720p --separate 2>&1 | grep -v Warn | grep -v "rows\|torch-mul" | tee $OUT/wan_pattern_sep.log
step 40 python3 wan_pattern.py wan14b-480p 2>&1 | grep -v Warn | grep "ditfuse\|copy" | tee $OUT/wan_pattern_fused.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
