#!/usr/bin/env bash
# Session 29, call k: `ditfuse check` on the H200 with the fp32 Gluon route (production-shape
# gates, the SAME-L attention accuracy gates among them).
source benchmarks/device_env.sh
BUDGET=330
step 320 python3 -m ditfuse check > $OUT/check.log 2>&1; echo "rc $?"; grep -E "FAIL" $OUT/check.log | tail -5; grep -iE "attention" $OUT/check.log | tail -8; tail -2 $OUT/check.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
