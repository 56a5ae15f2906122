#!/usr/bin/env bash
# Session 27, call d: the library A/B (Gluon route on / off, 5 alternating rounds), the
# bench's 16-bit attention rows with FlexAttention, and `ditfuse check` on the H200.
source benchmarks/device_env.sh
BUDGET=580
step 120 python3 benchmarks/attn_gluon_ab.py --rounds 5 > $OUT/attn_gluon_ab.log 2>&1; cat $OUT/attn_gluon_ab.log | tail -6
step 160 python3 -m ditfuse bench --op attention --shapes same-l-8704,same-l-trt,same-l-8704-plain,same-l-32946 --dtypes bf16 --extra-dtypes fp16 --impls ditfuse,ditfuse-graph,copy,flex --out-dir $OUT/bench_attn16 > $OUT/bench_attn16.log 2>&1; grep -E "ditfuse|flex" $OUT/bench_attn16.log | tail -14
rm -f $OUT/*/*.png
step 280 python3 -m ditfuse check > $OUT/check.log 2>&1; echo "rc $?"; grep -E "^\s+FAIL" $OUT/check.log | tail -5; tail -2 $OUT/check.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
