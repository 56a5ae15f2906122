#!/usr/bin/env bash
# Prepared in session 9 for the next session's first call (not run: session 9's device time
# was spent): the experimental persistent attention kernel (benchmarks/attn_persistent.py:
# the shipped per-tile code in a loop over a persistent grid's query tiles, nested or
# flattened key loops, 2-4 programs a SM; same bits as the shipped kernel on the CPU) against
# the table at the SAME-L shapes. sm_90 build: 213 registers nested / 244 flattened uncapped
# (2 programs a SM), 36-68 bytes of spill under the table's 168 cap -- the launch uses the
# table's cap.
source benchmarks/device_env.sh
BUDGET=400
step 380 python3 benchmarks/attn_persistent.py > $OUT/attn_persistent.log 2>&1
cat $OUT/attn_persistent.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
