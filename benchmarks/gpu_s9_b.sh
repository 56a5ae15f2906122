#!/usr/bin/env bash
# Session 9, second call: qk_norm_rope's warps a program at the shapes the per-token kernel
# serves (the table's floor of 4 warps predates the 32-bit in-token offsets and the cheaper
# tanh; on sm_90 2 warps issue 19-32% fewer instructions a token at head_dim 64).
source benchmarks/device_env.sh
BUDGET=400
step 200 python3 benchmarks/sweep_qk.py same-l-decoder,sa3-dit,flux1-1024,flux2-1024,qwen-image-1328,hunyuan-video-544p 1,2,4,8 bf16 > $OUT/sweep_qk.log 2>&1
step 90 python3 benchmarks/sweep_qk.py same-l-decoder,sa3-dit,flux1-1024 1,2,4,8 fp32 >> $OUT/sweep_qk.log 2>&1
step 60 python3 benchmarks/sweep_qk.py same-l-decoder,sa3-dit,flux1-1024 2,4 fp16 >> $OUT/sweep_qk.log 2>&1
grep -v "^\s*$" $OUT/sweep_qk.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
