#!/usr/bin/env bash
# Session 27, call g: two (batch, head) tiles a program over one cp.async ring
# (benchmarks/attn_gluon_pair.py): bits against the library's Gluon route, and times.
source benchmarks/device_env.sh
BUDGET=150
step 140 python3 benchmarks/attn_gluon_pair.py > $OUT/attn_gluon_pair.log 2>&1; tail -20 $OUT/attn_gluon_pair.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
