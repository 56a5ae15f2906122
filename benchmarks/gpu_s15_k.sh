#!/usr/bin/env bash
# Session 15 k: Wan in fp32 with 1 warp a tensor (flat_settings' 160 channels a thread).
source benchmarks/device_env.sh
BUDGET=150
step 140 python3 -m ditfuse bench --op qk_norm_rope --shapes wan14b-480p,wan1.3b-480p --dtypes fp32 --extra-dtypes "" --out-dir $OUT/bench_qk > $OUT/bench_qk.log 2>&1; grep -E "ditfuse" $OUT/bench_qk.log | tail -4
echo "seconds used by the steps: $(( SECONDS - T0 ))"
