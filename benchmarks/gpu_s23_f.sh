#!/usr/bin/env bash
# Session 23, call f: 64-row 4-warp mma.sync tiles (split P @ V) under a 168 cap against the
# shipped two-warp fp32 entry; the split_pv tests and the attention gates of `ditfuse check`.
source benchmarks/device_env.sh
BUDGET=300
step 120 python3 benchmarks/sweep_attention.py --s23c --cases=same-l-trt:fp32,same-l-8704:fp32,same-l-32946:fp32,same-l-8704-plain:fp32 > $OUT/sweep_s23c.log 2>&1
grep -E "us |BEST|Error" $OUT/sweep_s23c.log
step 60 python3 -m pytest tests/test_attention.py -k "split_pv or launch_settings or build" -p no:cacheprovider -q --tb=short > $OUT/pytest_split.log 2>&1; tail -n 3 $OUT/pytest_split.log
step 100 python3 -m ditfuse check > $OUT/check.log 2>&1; grep -cE "^\s+PASS" $OUT/check.log; grep -E "^\s+FAIL" $OUT/check.log | tail -5
echo "seconds used by the steps: $(( SECONDS - T0 ))"
