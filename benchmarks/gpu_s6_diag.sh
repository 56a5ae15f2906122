#!/usr/bin/env bash
# Session 6: where the GroupNorm split path's time goes (benchmarks/diag_gn_passes.py).
source benchmarks/device_env.sh
step 150 python3 benchmarks/diag_gn_passes.py > $OUT/diag_gn_passes.log 2>&1; grep -v Warn $OUT/diag_gn_passes.log | tail -40
echo "seconds used by the steps: $(( SECONDS - T0 ))"
