#!/usr/bin/env bash
# Session 9, fourth call: the SAME-L decode end to end (`ditfuse bench --e2e --models same-l`)
# with this session's QK table and tanh and the prologue apart (session 5's table predates
# both); prepared in session 8 as gpu_s9_next.sh.
source benchmarks/device_env.sh
BUDGET=560
step 540 python3 -m ditfuse bench --e2e --models same-l --out-dir $OUT/e2e_same > $OUT/e2e_same.log 2>&1
grep -vE "^\[|^$" $OUT/e2e_same.log | tail -16
echo "seconds used by the steps: $(( SECONDS - T0 ))"
