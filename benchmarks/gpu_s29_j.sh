#!/usr/bin/env bash
# Session 29, call j: the bench rows issue 5 names that the registry lacked -- SAME-L 32946
# plain (non-differential), bf16 and fp32, against dense-mask SDPA and FlexAttention.
source benchmarks/device_env.sh
BUDGET=300
step 280 python3 -m ditfuse bench --op attention --shapes same-l-32946-plain --dtypes bf16,fp32 --extra-dtypes "" --impls ditfuse,ditfuse-graph,copy,eager,flex --out-dir $OUT/bench_attn_plain > $OUT/bench_attn_plain.log 2>&1; grep -E "sliding" $OUT/bench_attn_plain.log | tail -12
rm -f $OUT/*/*.png
echo "seconds used by the steps: $(( SECONDS - T0 ))"
