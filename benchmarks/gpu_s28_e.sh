#!/usr/bin/env bash
# Session 28, call e: TMA-fed variants of the Gluon kernel against the library (cp.async):
# an mbarrier a tensor (fewer block barriers), a buffer a key tile (no ring), 4 programs an SM.
source benchmarks/device_env.sh
BUDGET=300
step 280 python3 benchmarks/attn_gluon_s28_ab.py --rounds 5 --variants library,tma_3st_128,tma2_3st_128,tma3_128,tma3 > $OUT/attn_gluon_s28_ab.log 2>&1; cat $OUT/attn_gluon_s28_ab.log | tail -6
echo "seconds used by the steps: $(( SECONDS - T0 ))"
