#!/usr/bin/env bash
# Session 26, call d: launch settings for the 16-bit SAME-L entries after the v10 trims
# (sweep_attention.py --s26: 16-key tiles at 116 registers, 4 programs a SM; the table's tile
# capped at 128), twice.
source benchmarks/device_env.sh
BUDGET=400
C="--cases=same-l-8704:bf16,same-l-32946:bf16,same-l-trt:bf16,same-l-8704-plain:bf16,same-l-8704:fp16"
step 190 python3 benchmarks/sweep_attention.py --s26 $C > $OUT/sweep_s26.log 2>&1; grep -E "us|BEST" $OUT/sweep_s26.log | tail -40
step 190 python3 benchmarks/sweep_attention.py --s26 $C > $OUT/sweep_s26_2.log 2>&1; grep -E "BEST" $OUT/sweep_s26_2.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
