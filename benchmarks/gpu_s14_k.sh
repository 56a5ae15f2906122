#!/usr/bin/env bash
# Session 14, last call: the qk_norm_rope Wan bench rows with the pair form (v10), and the
# flat-kernel GPU tests.
source benchmarks/device_env.sh
BUDGET=330
step 150 python3 -m ditfuse bench --op qk_norm_rope --shapes wan14b-480p,wan14b-720p,wan1.3b-480p,wan14b-480p-fused,wan14b-720p-fused --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench_qk > $OUT/bench_qk.log 2>&1; grep -E "ditfuse-graph" $OUT/bench_qk.log | tail -5
step 160 python3 -m pytest tests/test_qk_flat.py -p no:cacheprovider -q --tb=short -x > $OUT/pytest_qk.log 2>&1; tail -3 $OUT/pytest_qk.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
