#!/usr/bin/env bash
# Session 29, call b: the fp32 Gluon entry in 72 KB (3 programs an SM: one K buffer, two raw
# V buffers, one transposed V) against the 112 KB form (2 an SM) and the Triton entry.
source benchmarks/device_env.sh
BUDGET=300
step 280 python3 benchmarks/attn_gluon_fp32_s29.py --rounds 5 --variants vt1_168,ring_168 > $OUT/attn_gluon_fp32_s29.log 2>&1; tail -20 $OUT/attn_gluon_fp32_s29.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
