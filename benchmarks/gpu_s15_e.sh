#!/usr/bin/env bash
# Session 15 e: the flat kernel's (warps, split) table at Wan 2.2 5B (3072 channels, Q and K
# together) with half / full tables; the full bench of the two Q+K-together rows (1.3B's
# 142.8 us in b came after eager and compile, 124.5 us alone in d).
source benchmarks/device_env.sh
BUDGET=400
step 120 python3 benchmarks/flat_sweep.py wan5b-ti2v-704p --full 2>&1 | grep -v Warn | tee $OUT/flat_sweep.log
step 200 python3 -m ditfuse bench --op qk_norm_rope --shapes wan1.3b-480p,wan5b-ti2v-704p --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench_qk > $OUT/bench_qk.log 2>&1; grep -E "ditfuse" $OUT/bench_qk.log | tail -4
step 60 python3 benchmarks/tree_times.py s15e qk:wan1.3b-480p,wan5b-ti2v-704p 2>&1 | grep -v Warn | tee -a $OUT/tree_times.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
