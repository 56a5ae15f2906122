#!/usr/bin/env bash
# Session 21, third call: launch variants of the channel-RMS kernel (positions a program,
# warps, register caps) at wan-vae-out-480p.
source benchmarks/device_env.sh
BUDGET=400
step 300 python3 benchmarks/rms_variants.py > $OUT/rms_variants.log 2>&1; cat $OUT/rms_variants.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
