#!/usr/bin/env bash
# Session 23, call g: SAME-L decode end to end in fp32 with the two-warp attention entries.
source benchmarks/device_env.sh
BUDGET=280
step 260 python3 -m ditfuse bench --e2e --models same-l --dtypes fp32 --out-dir $OUT/e2e_same > $OUT/e2e_same.log 2>&1; grep -E "same-l" $OUT/e2e_same.log | tail -8
rm -f $OUT/*/*.png
echo "seconds used by the steps: $(( SECONDS - T0 ))"
