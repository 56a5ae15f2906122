#!/usr/bin/env bash
# Session 15 f: flat kernel with Q and K always in programs of their own (80 channels a
# thread): the full bench of every Wan QK row in bf16 and Wan 1.3B / 5B in fp32, fp16; the
# flat-kernel GPU tests.
source benchmarks/device_env.sh
BUDGET=560
step 300 python3 -m ditfuse bench --op qk_norm_rope --shapes wan14b-480p,wan14b-720p,wan1.3b-480p,wan5b-ti2v-704p,wan14b-480p-fused,wan14b-720p-fused --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench_qk > $OUT/bench_qk.log 2>&1; grep -E "ditfuse-graph" $OUT/bench_qk.log | tail -6
step 120 python3 -m ditfuse bench --op qk_norm_rope --shapes wan1.3b-480p,wan5b-ti2v-704p --dtypes fp32,fp16 --extra-dtypes "" --impls copy,ditfuse,ditfuse-graph --out-dir $OUT/bench_qk32 > $OUT/bench_qk32.log 2>&1; grep -E "ditfuse-graph" $OUT/bench_qk32.log | tail -4
step 130 python3 -m pytest tests/test_qk_flat.py -p no:cacheprovider -q --tb=short -x > $OUT/pytest_qk.log 2>&1; tail -3 $OUT/pytest_qk.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
