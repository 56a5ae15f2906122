#!/usr/bin/env bash
# Session 26, call c: `ditfuse check` (every op's parity gates at production shapes) with the
# v10 attention kernel.
source benchmarks/device_env.sh
BUDGET=300
step 280 python3 -m ditfuse check > $OUT/check.log 2>&1; echo "rc $?"; grep -cE "^\s+PASS" $OUT/check.log; grep -E "^\s+FAIL" $OUT/check.log | tail -5; tail -3 $OUT/check.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
