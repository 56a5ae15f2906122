#!/usr/bin/env bash
# Session 7, fourth call: the new warps rule (APPLY_PER_THREAD = 64: 4 warps an 8192 tile) and
# its neighbours, then GroupNorm tests + gates on CUDA and the group_norm bench rows.
source benchmarks/device_env.sh
R="wan-vae-out-480p wan-vae-mid-480p"
G="flux-vae-out-1024 flux-vae-up2-512 flux-vae-up1-256 hunyuan-vae-up-9f flux-vae-mid-128 hunyuan-vae-mid"
t() { BUDGET=${B:-250} step 45 env "$@" >> $OUT/sweep.log 2>&1; }
t python3 benchmarks/gn_times.py table $R $G
t WARPS=2 python3 benchmarks/gn_times.py w2 $R $G
t LAUNCH='{"tile": 16384}' python3 benchmarks/gn_times.py t16k $R $G
t LAUNCH='{"tile": 16384}' WARPS=4 python3 benchmarks/gn_times.py t16k-w4 $R $G
t STATS_WARPS=4 python3 benchmarks/gn_times.py sw4 $G
grep " us" $OUT/sweep.log
BUDGET=290 step 40 python3 benchmarks/gn_gates.py > $OUT/check_gn.log 2>&1
grep -c PASS $OUT/check_gn.log; grep -E "FAIL|Error" $OUT/check_gn.log | head
BUDGET=400 step 100 python3 -m pytest tests/test_group_norm.py tests/test_fastpath.py -p no:cacheprovider -q -x --tb=short \
  > $OUT/pytest_gn.log 2>&1; tail -2 $OUT/pytest_gn.log
BUDGET=560 step 150 python3 -m ditfuse bench --op group_norm --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench_gn > $OUT/bench_gn.log 2>&1; grep -E "ditfuse-graph|compile" $OUT/bench_gn.log | head -20
echo "seconds used by the steps: $(( SECONDS - T0 ))"
