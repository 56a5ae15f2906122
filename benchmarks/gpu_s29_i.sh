#!/usr/bin/env bash
# Session 29, call i: the 72 KB fp32 form with every copy a trip ahead (K1 / K2 TMA ring, V
# through registers; 3 programs an SM) against the shipped kernel and call b's ring.
source benchmarks/device_env.sh
BUDGET=200
step 180 python3 benchmarks/attn_gluon_fp32_s29.py --rounds 3 --variants kernel,reg3,ring_168 > $OUT/attn_gluon_fp32_s29.log 2>&1; tail -13 $OUT/attn_gluon_fp32_s29.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
