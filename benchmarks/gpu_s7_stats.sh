#!/usr/bin/env bash
# Session 7, last call: GroupNorm statistics pass with 4 warps where a program sums <= 4
# tiles (table) vs 8 everywhere (STATS_WARPS=8, the previous table); gates, GN tests, bench.
source benchmarks/device_env.sh
G="flux-vae-out-1024 flux-vae-up2-512 flux-vae-up1-256 hunyuan-vae-up-9f flux-vae-mid-128 hunyuan-vae-mid"
BUDGET=60 step 30 python3 benchmarks/gn_times.py table $G >> $OUT/times.log 2>&1
STATS_WARPS=8 BUDGET=60 step 30 python3 benchmarks/gn_times.py sw8 $G >> $OUT/times.log 2>&1
grep " us" $OUT/times.log
BUDGET=75 step 15 python3 benchmarks/gn_gates.py > $OUT/check_gn.log 2>&1
grep -c PASS $OUT/check_gn.log; grep -E "FAIL|Error" $OUT/check_gn.log | head
BUDGET=125 step 50 python3 -m ditfuse bench --op group_norm --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench_gn > $OUT/bench_gn.log 2>&1; grep -E "ditfuse-graph" $OUT/bench_gn.log | head -8
BUDGET=190 step 65 python3 -m pytest tests/test_group_norm.py -p no:cacheprovider -q -x --tb=short > $OUT/pytest_gn.log 2>&1; tail -1 $OUT/pytest_gn.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
