#!/usr/bin/env bash
# A session's measuring device call after kernel changes: first the GPU-only tests with one
# line per test, then the changed ops re-benchmarked (OPS, default qk_norm_rope and adaln;
# merged into BASE's CSV and chart) and their launch-settings sweeps. Every step bounded by
# what remains of BUDGET seconds. Carry .whl; copy $OUT into benchmarks/results and benchmarks/logs.
source benchmarks/device_env.sh
step 190 python3 -m pytest tests/test_aot.py tests/test_patch_cuda_graph.py tests/test_no_half_fma.py \
  -v -p no:cacheprovider --tb=short -rs -k "gpu or cuda_graph or half" \
  > $OUT/pytest_gpu.log 2>&1; grep -E "PASS|FAIL|ERROR|SKIP|passed|failed" $OUT/pytest_gpu.log | tail -30
BASE=${BASE:-benchmarks/results/NVIDIA-H200-2026-11-29.csv}
for op in ${OPS:-qk_norm_rope adaln}; do
  step 110 python3 -m ditfuse bench --op $op --out-dir /tmp/b_$op >> $OUT/bench.log 2>&1
done
grep -E "ditfuse-graph|compile " $OUT/bench.log | grep bf16 | head -40
python3 benchmarks/merge_results.py $OUT/NVIDIA-H200-$(date +%F).csv $BASE /tmp/b_*/*.csv
step 80 python3 benchmarks/sweep_qk.py ${QK_SWEEP:-wan14b-480p,wan14b-720p,flux1-1024,flux2-1024,hunyuan-video-544p 4,8,16} > $OUT/sweep_qk.log 2>&1; grep BEST $OUT/sweep_qk.log
step 80 python3 benchmarks/sweep_adaln.py > $OUT/sweep_adaln.log 2>&1; grep BEST $OUT/sweep_adaln.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
