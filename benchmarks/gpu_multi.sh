#!/usr/bin/env bash
# The 2 x H200 device call (issues 6, 7, 8): the AOT GPU tests, sequence-parallel Wan under
# diffusers' ContextParallelConfig (Ulysses, ring), head-parallel across-heads norm, the
# end-to-end table. Carry .whl; copy $OUT into benchmarks/logs and benchmarks/results.
source benchmarks/device_env.sh
nvidia-smi -L
timeout 150 python3 -m pytest tests/test_aot.py -q -p no:cacheprovider --tb=short -rs -s -k "gpu or loader_binds or random_inputs" > $OUT/pytest_aot_gpu.log 2>&1; tail -4 $OUT/pytest_aot_gpu.log
timeout 200 torchrun --nproc-per-node 2 -m ditfuse.examples.wan_context_parallel --mode both --out $OUT/context_parallel.txt > $OUT/context_parallel.log 2>&1; tail -15 $OUT/context_parallel.log
timeout 60 torchrun --nproc-per-node 2 -m ditfuse.examples.wan_parallel > $OUT/head_parallel.log 2>&1; tail -4 $OUT/head_parallel.log
timeout ${E2E_S:-200} python3 -m ditfuse bench --e2e --layers 2 --out-dir $OUT > $OUT/e2e.log 2>&1; tail -30 $OUT/e2e.log
