#!/usr/bin/env bash
# Session 9, seventh and eighth calls: GroupNorm flux-vae-out-1024 measured 228.7 us in this session's
# bench against 216.1 in session 7's (logs/s7/stats5), the copy the same (130.6 vs 130.7):
# A/B of three trees in one process each, alternating twice -- session 7's measured commit
# (ab2/src, 6500884), this session's first commit (ab/src, eac5f99) and this tree (PDL on
# and off).
source benchmarks/device_env.sh
BUDGET=330
S="flux-vae-out-1024 flux-vae-up2-512 hunyuan-vae-up-9f flux-vae-mid-128"
for i in 1 2; do
  PYTHONPATH=/tmp/site:$PWD/ab2/src step 40 python3 benchmarks/gn_times.py s7 $S >> $OUT/gn_ab.log 2>&1
  PYTHONPATH=/tmp/site:$PWD/ab/src step 40 python3 benchmarks/gn_times.py s8 $S >> $OUT/gn_ab.log 2>&1
  PDL=0 step 40 python3 benchmarks/gn_times.py nopdl $S >> $OUT/gn_ab.log 2>&1
  PDL=1 step 40 python3 benchmarks/gn_times.py pdl $S >> $OUT/gn_ab.log 2>&1
done
sort -k2,2 -s $OUT/gn_ab.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
