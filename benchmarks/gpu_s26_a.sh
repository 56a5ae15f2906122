#!/usr/bin/env bash
# Session 26, call a: the A/B of the kernel trims (s25 -> minit -> mh -> ship, same bits;
# benchmarks/attn_epilogue_ab.py), 5 rounds on every SAME-L case; then the bench's attention
# rows with the working tree's kernel (bf16 + fp16 with FlexAttention, fp32).
source benchmarks/device_env.sh
BUDGET=560
step 200 python3 benchmarks/attn_epilogue_ab.py --rounds 5 > $OUT/attn_epilogue_ab.log 2>&1; grep -v "max|d|" $OUT/attn_epilogue_ab.log | tail -30; grep -c "bitwise s25's: True" $OUT/attn_epilogue_ab.log; grep "bitwise s25's: False" $OUT/attn_epilogue_ab.log
step 130 python3 -m ditfuse bench --op attention --shapes same-l-8704,same-l-trt,same-l-8704-plain,same-l-32946 --dtypes bf16 --extra-dtypes fp16 --impls ditfuse,ditfuse-graph,copy,flex --out-dir $OUT/bench_attn16 > $OUT/bench_attn16.log 2>&1; grep -E "ditfuse|flex" $OUT/bench_attn16.log | tail -14
step 100 python3 -m ditfuse bench --op attention --shapes same-l-8704,same-l-trt,same-l-8704-plain,same-l-32946 --dtypes fp32 --extra-dtypes "" --impls ditfuse,ditfuse-graph,copy --out-dir $OUT/bench_attn32 > $OUT/bench_attn32.log 2>&1; grep -E "ditfuse" $OUT/bench_attn32.log | tail -8
rm -f $OUT/*/*.png
echo "seconds used by the steps: $(( SECONDS - T0 ))"
