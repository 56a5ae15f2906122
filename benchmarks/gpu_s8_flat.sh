#!/usr/bin/env bash
# Session 8, third call: the flat-row QK kernel's variants (warps, Q and K in programs of
# their own, ptxas register caps) against the plain calibration kernels, Wan shapes, bf16.
source benchmarks/device_env.sh
BUDGET=300
step 240 python3 benchmarks/calib_qk.py wan14b-480p wan14b-720p wan1.3b-480p > $OUT/calib_qk.log 2>&1
cat $OUT/calib_qk.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
