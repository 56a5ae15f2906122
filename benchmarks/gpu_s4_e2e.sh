#!/usr/bin/env bash
# Session 4's e2e call after the ops moved off torch.library.custom_op (host cost of a call
# in a compiled graph): the compiled / CUDA-graph GPU tests, e2e at 4 blocks then 2 (the
# difference is the per-block cost), the activations re-benchmarked with the swept table
# (merged into BASE's CSV). Every step bounded by BUDGET. Carry .whl.
source benchmarks/device_env.sh
BASE=${BASE:-benchmarks/results/NVIDIA-H200-2026-11-29.csv}
M=${MODELS:-wan14b-480p,flux1-1024,flux2-1024}
step 70 python3 -m pytest tests/test_patch_cuda_graph.py tests/test_qk_library.py -p no:cacheprovider --tb=short -q -rs \
  > $OUT/pytest_gpu_ops.log 2>&1; tail -4 $OUT/pytest_gpu_ops.log
step 230 python3 -m ditfuse bench --e2e --models $M --layers 4 --out-dir $OUT/l4 2>&1 | grep -v Warn > $OUT/e2e_l4.log; grep -E "eager|compile" $OUT/e2e_l4.log
step 50 python3 -m ditfuse bench --op activations --dtypes bf16 --extra-dtypes "" --out-dir /tmp/b_act > $OUT/bench_act.log 2>&1 \
  && python3 benchmarks/merge_results.py $OUT/NVIDIA-H200-$(date +%F).csv $BASE /tmp/b_act/*.csv; grep -E "ditfuse-graph|compile " $OUT/bench_act.log | head
step 200 python3 -m ditfuse bench --e2e --models $M --layers 2 --out-dir $OUT/l2 2>&1 | grep -v Warn > $OUT/e2e_l2.log; grep -E "eager|compile" $OUT/e2e_l2.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
