#!/usr/bin/env bash
# Session 29, call a: the fp32 Gluon entry (tf32 wgmma, V transposed in shared memory)
# against the shipped Triton fp32 entry: accuracy at 9 cases, CUDA-graph times at 3 shapes.
source benchmarks/device_env.sh
BUDGET=400
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
step 380 python3 benchmarks/attn_gluon_fp32_s29.py --rounds 5 > $OUT/attn_gluon_fp32_s29.log 2>&1; tail -20 $OUT/attn_gluon_fp32_s29.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
