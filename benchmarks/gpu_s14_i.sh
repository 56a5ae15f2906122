#!/usr/bin/env bash
# Session 14, ninth call: the pair form through one code path for Q and K programs (v10) --
# Wan against its access pattern (separate Q / K, diffusers' default; fused QKV rows), the
# QK GPU tests, and the qk_norm_rope bench rows (Wan rows now the separate form).
source benchmarks/device_env.sh
BUDGET=560
cd benchmarks
step 60 python3 wan_pattern.py wan14b-480p wan14b-720p wan1.3b-480p --separate 2>&1 | grep -v Warn | grep -v "rows\|torch-mul" | tee $OUT/wan_pattern_sep.log
step 40 python3 wan_pattern.py wan14b-480p 2>&1 | grep -v Warn | grep ditfuse | tee $OUT/wan_pattern_fused.log
cd ..
step 220 python3 -m ditfuse bench --op qk_norm_rope --shapes wan14b-480p,wan14b-720p,wan1.3b-480p,wan14b-480p-fused,wan14b-720p-fused --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench_qk > $OUT/bench_qk.log 2>&1; grep -E "ditfuse-graph" $OUT/bench_qk.log
step 200 python3 -m pytest tests/test_qk_flat.py tests/test_qk_fuzz.py -p no:cacheprovider -q --tb=short -x > $OUT/pytest_qk.log 2>&1; tail -3 $OUT/pytest_qk.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
