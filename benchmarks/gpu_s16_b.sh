#!/usr/bin/env bash
# Session 16, call b: 16-query tiles with two warps (no spills in fp32, unlike session 15's
# one-warp tiles) at every SAME-L case, differential and plain.
source benchmarks/device_env.sh
BUDGET=400
step 380 python3 benchmarks/sweep_attention.py --s16b --cases=same-l-8704:bf16,same-l-8704:fp32,same-l-trt:fp32,same-l-trt:bf16,same-l-32946:bf16,same-l-32946:fp32,same-l-8704-plain:bf16,same-l-8704-plain:fp32 2>&1 | grep -v Warn | tee $OUT/sweep_attention_s16b.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
