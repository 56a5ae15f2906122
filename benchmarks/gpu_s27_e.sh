#!/usr/bin/env bash
# Session 27, call e: FlexAttention's time measured several ways against ditfuse's
# (benchmarks/flex_ratio.py), then the Gluon prototype's epilogue variant (stored from the
# accumulator layout) against the shipped one (benchmarks/attn_gluon.py).
source benchmarks/device_env.sh
BUDGET=400
step 200 python3 benchmarks/flex_ratio.py --rounds 3 > $OUT/flex_ratio.log 2>&1; tail -14 $OUT/flex_ratio.log
step 150 python3 benchmarks/attn_gluon.py > $OUT/attn_gluon.log 2>&1; grep -E "bitwise|round" $OUT/attn_gluon.log; grep -v " 0 elements" $OUT/attn_gluon.log | grep check | head -5
echo "seconds used by the steps: $(( SECONDS - T0 ))"
