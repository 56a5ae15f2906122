#!/usr/bin/env bash
# Session 23, third call: the shipped kernel with split_pv (warps along the query rows of a
# multi-warp mma.sync tile) swept at the SAME-L shapes, fp32 and bf16, differential and plain.
source benchmarks/device_env.sh
BUDGET=420
step 400 python3 benchmarks/sweep_attention.py --s23b --cases=same-l-trt:fp32,same-l-8704:fp32,same-l-32946:fp32,same-l-8704-plain:fp32,same-l-8704:bf16,same-l-trt:bf16,same-l-32946:bf16 > $OUT/sweep_s23b.log 2>&1
cat $OUT/sweep_s23b.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
