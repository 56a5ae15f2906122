#!/usr/bin/env bash
# Session 23, second call: fp32 band attention with warps along the query rows (split P @ V,
# benchmarks/attn_rows_per_warp.py) against the shipped one-warp entry.
source benchmarks/device_env.sh
BUDGET=300
step 280 python3 benchmarks/attn_rows_per_warp.py > $OUT/attn_rows_per_warp.log 2>&1
cat $OUT/attn_rows_per_warp.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
