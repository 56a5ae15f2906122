#!/usr/bin/env bash
# Session 18, call e: the AOT package on the H200 (driver launch bitwise the JIT call, CUDA-graph
# replay, launch-time parity) with the step and the fp32 cap in the table; the fp32 attention
# bench rows with the cap; the SAME-L decode end to end (fp32, bf16) with the session's table.
source benchmarks/device_env.sh
BUDGET=560
step 90 python3 -m pytest tests/test_aot.py -k "gpu or attention" -p no:cacheprovider -q --tb=short > $OUT/pytest_aot_gpu.log 2>&1; tail -n 3 $OUT/pytest_aot_gpu.log
step 130 python3 -m ditfuse bench --op attention --shapes same-l-8704,same-l-trt,same-l-8704-plain,same-l-32946 --dtypes fp32 --extra-dtypes "" --impls ditfuse,ditfuse-graph,copy --out-dir $OUT/bench_attn32 > $OUT/bench_attn32.log 2>&1; grep -E "ditfuse-graph" $OUT/bench_attn32.log | tail -4
step 320 python3 -m ditfuse bench --e2e --models same-l --dtypes fp32,bf16 --out-dir $OUT/e2e_same > $OUT/e2e_same.log 2>&1; grep -E "same-l" $OUT/e2e_same.log | tail -12
rm -f $OUT/*/*.png
echo "seconds used by the steps: $(( SECONDS - T0 ))"
