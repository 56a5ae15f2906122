#!/usr/bin/env bash
# Session 29, call h: the grid order (token-major: every head of a few query tiles at once,
# whole token rows from DRAM; head-major: a few heads' tiles) for the shipped fp32 Gluon
# kernel and the persistent form (call e's persistent run was head-major).
source benchmarks/device_env.sh
BUDGET=200
step 180 python3 benchmarks/attn_gluon_fp32_s29.py --rounds 3 --variants kernel,kernel_hm,persist,persist_hm > $OUT/attn_gluon_fp32_s29.log 2>&1; tail -13 $OUT/attn_gluon_fp32_s29.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
