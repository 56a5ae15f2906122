#!/usr/bin/env bash
# Session 24, call a: GroupNorm's split path with an L2 set-aside for its evict_last lines;
# band attention's time against its program count.
source benchmarks/device_env.sh
BUDGET=300
cd benchmarks
step 150 python3 gn_l2_persist.py > $OUT/gn_l2_persist.log 2>&1; cat $OUT/gn_l2_persist.log | tail -14
step 120 python3 attn_waves.py > $OUT/attn_waves.log 2>&1; cat $OUT/attn_waves.log | tail -50
echo "seconds used by the steps: $(( SECONDS - T0 ))"
