#!/usr/bin/env bash
# Session 17, call i: the attention rows' copy column re-measured with the floor's bytes
# (bench.attention_copy_parts: until now every chunk and the output's size were copied, twice
# the bytes the floor counts), for the cases the results CSV has.
source benchmarks/device_env.sh
BUDGET=200
step 60 python3 -m ditfuse bench --op attention --shapes same-l-8704,same-l-32946,same-l-8704-plain,same-l-trt --dtypes bf16 --extra-dtypes "" --impls copy --out-dir $OUT/a_bf16 > $OUT/copy_bf16.log 2>&1; grep copy $OUT/copy_bf16.log | tail -4
step 40 python3 -m ditfuse bench --op attention --shapes same-l-8704,same-l-trt --dtypes fp16 --extra-dtypes "" --impls copy --out-dir $OUT/a_fp16 > $OUT/copy_fp16.log 2>&1; grep copy $OUT/copy_fp16.log | tail -2
step 60 python3 -m ditfuse bench --op attention --shapes same-l-8704,same-l-trt,same-l-8704-plain,same-l-32946 --dtypes fp32 --extra-dtypes "" --impls copy --out-dir $OUT/a_fp32 > $OUT/copy_fp32.log 2>&1; grep copy $OUT/copy_fp32.log | tail -4
rm -f $OUT/*/*.png
echo "seconds used by the steps: $(( SECONDS - T0 ))"
