#!/usr/bin/env bash
# Session 15 b: Wan's processor passes half-width tables now; the Wan bench rows, the flat
# kernel's (warps, split) table with them, and the flat-kernel GPU tests.
source benchmarks/device_env.sh
BUDGET=420
step 150 python3 -m ditfuse bench --op qk_norm_rope --shapes wan14b-480p,wan14b-720p,wan1.3b-480p,wan14b-480p-fused,wan14b-720p-fused --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench_qk > $OUT/bench_qk.log 2>&1; grep -E "ditfuse-graph" $OUT/bench_qk.log | tail -5
step 90 python3 benchmarks/flat_sweep.py wan1.3b-480p wan14b-480p 2>&1 | grep -v Warn | tee $OUT/flat_sweep.log
step 160 python3 -m pytest tests/test_qk_flat.py -p no:cacheprovider -q --tb=short -x -k "half or pair" > $OUT/pytest_qk.log 2>&1; tail -3 $OUT/pytest_qk.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
