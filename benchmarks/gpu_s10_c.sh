#!/usr/bin/env bash
# Session 10, third call: qk_norm_rope with half-width RoPE tables (one cos / sin load a
# pair; the patched Wan and Qwen-Image pass such tables, packed): A/B against the session's
# first tree (ab/src) with the tables as the models pass them, alternating twice; then the
# GPU tests of the QK kernels and the patches, and the qk_norm_rope bench rows.
source benchmarks/device_env.sh
BUDGET=560
S="wan14b-480p wan14b-720p wan1.3b-480p qwen-image-1328 flux1-1024"
for i in 1 2; do
  PYTHONPATH=/tmp/site:$PWD/ab/src step 60 python3 benchmarks/qk_ab.py old --model-tables $S >> $OUT/qk_ab.log 2>&1
  step 60 python3 benchmarks/qk_ab.py new --model-tables $S >> $OUT/qk_ab.log 2>&1
done
step 40 python3 benchmarks/qk_ab.py new-full wan14b-480p qwen-image-1328 >> $OUT/qk_ab.log 2>&1
sort -k2,2 -s $OUT/qk_ab.log
step 150 python3 -m pytest tests/test_qk_flat.py tests/test_qk_norm_rope.py tests/test_inspect.py -p no:cacheprovider -q --tb=short -x > $OUT/pytest_qk.log 2>&1
tail -2 $OUT/pytest_qk.log
step 200 python3 -m ditfuse bench --op qk_norm_rope --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench > $OUT/bench_qk.log 2>&1
grep -E "ditfuse-graph" $OUT/bench_qk.log | tail -12
echo "seconds used by the steps: $(( SECONDS - T0 ))"
