#!/usr/bin/env bash
# Session 15 c: the flat kernel's (warps, split) table with half-width tables (Wan 1.3B
# slowed 113 -> 143 us on them in b).
source benchmarks/device_env.sh
BUDGET=200
step 180 python3 benchmarks/flat_sweep.py wan1.3b-480p wan14b-480p 2>&1 | grep -v Warn | tee $OUT/flat_sweep.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
