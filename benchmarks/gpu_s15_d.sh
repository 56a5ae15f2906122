#!/usr/bin/env bash
# Session 15 d: Wan 1.3B -- the bench (142.8 us in b) and flat_sweep (124.5 us in c) at the
# same settings disagreed: both, plus tree_times, in one call; the sweep with full tables too.
source benchmarks/device_env.sh
BUDGET=300
step 60 python3 benchmarks/tree_times.py s15d qk:wan1.3b-480p 2>&1 | grep -v Warn | tee $OUT/tree_times.log
step 90 python3 -m ditfuse bench --op qk_norm_rope --shapes wan1.3b-480p --dtypes bf16 --extra-dtypes "" --impls copy,ditfuse,ditfuse-graph --out-dir $OUT/bench_qk > $OUT/bench_qk.log 2>&1; grep -E "ditfuse" $OUT/bench_qk.log | tail -3
step 120 python3 benchmarks/flat_sweep.py wan1.3b-480p --full 2>&1 | grep -v Warn | tee $OUT/flat_sweep.log
step 60 python3 benchmarks/tree_times.py s15d qk:wan1.3b-480p 2>&1 | grep -v Warn | tee -a $OUT/tree_times.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
