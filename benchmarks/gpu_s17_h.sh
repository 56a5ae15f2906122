#!/usr/bin/env bash
# Session 17, call h: the flat kernel's (warps, split) at Wan 1.3B / 2.2 5B now that the call is
# out of place (session 15 swept them in place: 1.3B 1 warp Q and K together 107.4 us against
# 110.7 split, a form that moved inside a full bench run), twice.
source benchmarks/device_env.sh
BUDGET=250
for r in 1 2; do
  step 110 python3 benchmarks/flat_sweep.py wan1.3b-480p wan5b-ti2v-704p > $OUT/flat_sweep_$r.log 2>&1; cat $OUT/flat_sweep_$r.log
done
echo "seconds used by the steps: $(( SECONDS - T0 ))"
