#!/usr/bin/env bash
# Session 10, fourth call: the patched Wan now passes full-width tables (its columns repeated
# a pair) and Qwen-Image packed half-width ones: the GPU tests (QK kernels, inspect, the
# Wan / Qwen patches), the model-table QK times (Wan full vs half form), then the bench rows.
source benchmarks/device_env.sh
BUDGET=500
step 170 python3 -m pytest tests/test_qk_flat.py tests/test_qk_norm_rope.py tests/test_inspect.py -p no:cacheprovider -q --tb=short > $OUT/pytest_qk.log 2>&1
tail -3 $OUT/pytest_qk.log
step 90 python3 -m pytest tests/test_patch.py tests/test_qk_norm_rope_diffusers.py -k "wan or Wan or qwen or Qwen" -p no:cacheprovider -q --tb=short > $OUT/pytest_patch.log 2>&1
tail -3 $OUT/pytest_patch.log
S="wan14b-480p wan14b-720p wan1.3b-480p qwen-image-1328"
step 40 python3 benchmarks/qk_ab.py full --model-tables $S >> $OUT/qk_ab.log 2>&1
step 40 python3 benchmarks/qk_ab.py half --model-tables --half $S >> $OUT/qk_ab.log 2>&1
cat $OUT/qk_ab.log
step 160 python3 -m ditfuse bench --op qk_norm_rope --shapes wan14b-480p,wan14b-720p,wan1.3b-480p,qwen-image-1328 --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench > $OUT/bench_qk.log 2>&1
grep -E "ditfuse-graph" $OUT/bench_qk.log | tail -6
echo "seconds used by the steps: $(( SECONDS - T0 ))"
