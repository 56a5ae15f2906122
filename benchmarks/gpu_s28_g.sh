#!/usr/bin/env bash
# Session 28, call g: the bench's 16-bit attention rows with v12 (ditfuse, graph, copy,
# FlexAttention) and FlexAttention's ratio at SAME-L 8704 bf16 (benchmarks/flex_ratio.py).
source benchmarks/device_env.sh
BUDGET=260
step 170 python3 -m ditfuse bench --op attention --shapes same-l-8704,same-l-trt,same-l-8704-plain,same-l-32946 --dtypes bf16 --extra-dtypes fp16 --impls ditfuse,ditfuse-graph,copy,flex --out-dir $OUT/bench_attn16 > $OUT/bench_attn16.log 2>&1; grep -E "ditfuse|flex" $OUT/bench_attn16.log | tail -14
rm -f $OUT/*/*.png
step 80 python3 benchmarks/flex_ratio.py --rounds 3 --cases same-l-8704-bfloat16,same-l-32946-bfloat16 > $OUT/flex_ratio.log 2>&1; tail -6 $OUT/flex_ratio.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
