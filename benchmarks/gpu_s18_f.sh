#!/usr/bin/env bash
# Session 18, call f: the final table (query step; fp32 one-warp entries capped at 224) under
# the GPU tests: the AOT package's CUDA-graph replay and launch-time parity (cut in call e), the
# attention tests (with the step's new tests), 150 randomized attention cases, ditfuse check.
source benchmarks/device_env.sh
BUDGET=480
step 100 python3 -m pytest tests/test_aot.py -k "gpu_cuda_graph or launch_time or driver_launch" -p no:cacheprovider -q --tb=short > $OUT/pytest_aot_gpu.log 2>&1; tail -n 3 $OUT/pytest_aot_gpu.log
step 150 python3 -m pytest tests/test_attention.py -p no:cacheprovider -q --tb=short > $OUT/pytest_attn.log 2>&1; tail -n 3 $OUT/pytest_attn.log
DITFUSE_FUZZ_N=150 step 110 python3 -m pytest tests/test_attention_fuzz.py -p no:cacheprovider -q --tb=short > $OUT/pytest_attn_fuzz.log 2>&1; tail -n 3 $OUT/pytest_attn_fuzz.log
step 110 python3 -m ditfuse check > $OUT/check.log 2>&1; tail -n 4 $OUT/check.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
