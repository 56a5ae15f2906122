#!/usr/bin/env bash
# Session 21, seventh call: GroupNorm's apply pass with several tiles a program and the next
# tile's loads pipelined (gn_apply_loop.py), at the split-path registry shapes, bf16.
source benchmarks/device_env.sh
BUDGET=300
step 280 python3 benchmarks/gn_apply_loop.py > $OUT/gn_apply_loop.log 2>&1; cat $OUT/gn_apply_loop.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
