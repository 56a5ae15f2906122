#!/usr/bin/env bash
# Session 18, call c: the attention bench rows with the query step in the table (and the plain
# entries: 16-bit 3 stages, fp32 32-query one-warp tiles), bf16 / fp16 / fp32.
source benchmarks/device_env.sh
BUDGET=570
step 220 python3 -m ditfuse bench --op attention --shapes same-l-8704,same-l-32946,same-l-8704-plain,same-l-trt --dtypes bf16 --extra-dtypes fp16 --out-dir $OUT/bench_attn16 > $OUT/bench_attn16.log 2>&1; grep -E "ditfuse-graph|flex " $OUT/bench_attn16.log | tail -12
step 150 python3 -m ditfuse bench --op attention --shapes same-l-8704,same-l-trt,same-l-8704-plain --dtypes fp32 --extra-dtypes "" --out-dir $OUT/bench_attn32 > $OUT/bench_attn32.log 2>&1; grep -E "ditfuse-graph|flex " $OUT/bench_attn32.log | tail -6
step 120 python3 -m ditfuse bench --op attention --shapes same-l-32946 --dtypes fp32 --extra-dtypes "" --out-dir $OUT/bench_attn32946 > $OUT/bench_attn32946.log 2>&1; grep -E "ditfuse-graph|flex " $OUT/bench_attn32946.log | tail -3
rm -f $OUT/*/*.png
echo "seconds used by the steps: $(( SECONDS - T0 ))"
