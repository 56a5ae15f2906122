#!/usr/bin/env bash
# Session 8, fourth call: the flat-row QK kernel's warps with and without the Q/K split, bf16
# and fp32 (no register caps: a shipped QK build must not spill); SAME's prologue apart.
source benchmarks/device_env.sh
BUDGET=300
step 150 python3 benchmarks/calib_qk.py wan14b-480p wan14b-720p wan1.3b-480p > $OUT/calib_qk.log 2>&1
step 80 python3 benchmarks/calib_qk.py --fp32 wan14b-480p wan1.3b-480p >> $OUT/calib_qk.log 2>&1
grep -v "^copy" $OUT/calib_qk.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
