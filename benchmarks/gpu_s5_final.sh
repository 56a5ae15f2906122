#!/usr/bin/env bash
# Session 5's last call: the compiled / CUDA-graph GPU tests with replayed launches, the e2e
# table at 4 blocks with steps timed back to back (e2e.loop_timer), and the FLUX-shape op
# benches (their "ditfuse call" rows carry the host cost), merged into BASE's CSV. Carry .whl.
source benchmarks/device_env.sh
BASE=${BASE:-benchmarks/results/NVIDIA-H200-2026-11-30.csv}
step 90 python3 -m pytest tests/test_patch_cuda_graph.py tests/test_qk_library.py -p no:cacheprovider --tb=short -q -rs \
  > $OUT/pytest_gpu_graphs.log 2>&1; tail -3 $OUT/pytest_gpu_graphs.log
step 300 python3 -m ditfuse bench --e2e --models flux1-1024,flux2-1024,wan14b-480p --layers 4 --out-dir $OUT/l4 2>&1 | grep -v Warn > $OUT/e2e_l4.log; grep -E "eager|compile" $OUT/e2e_l4.log
NEW=()
step 110 python3 -m ditfuse bench --op adaln --shapes flux1-1024,flux2-1024 --dtypes bf16 --extra-dtypes "" --out-dir /tmp/b_ad > $OUT/bench.log 2>&1 && NEW+=(/tmp/b_ad/*.csv)
step 100 python3 -m ditfuse bench --op qk_norm_rope --shapes flux1-1024,flux2-1024,qwen-image-1328,sa3-dit --dtypes bf16 --extra-dtypes "" --out-dir /tmp/b_qk >> $OUT/bench.log 2>&1 && NEW+=(/tmp/b_qk/*.csv)
(( ${#NEW[@]} )) && python3 benchmarks/merge_results.py $OUT/NVIDIA-H200-$(date +%F).csv $BASE "${NEW[@]}"
grep -E "ditfuse " $OUT/bench.log | head -12
echo "seconds used by the steps: $(( SECONDS - T0 ))"
