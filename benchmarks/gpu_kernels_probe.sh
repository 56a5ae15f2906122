#!/usr/bin/env bash
# Kernel-variant probe: the persistent TMA QK kernel against the per-token one (settings
# sweep, bitwise check), then the attention launch-settings sweep (grid order, unaligned key
# tiles). Every step bounded by what remains of BUDGET seconds. Carry .whl; copy $OUT into
# benchmarks/logs.
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > $OUT/gpu.txt
step 300 python3 benchmarks/sweep_qk_tma.py ${QK_SHAPES_ARG:-wan14b-480p,wan14b-720p,flux1-1024,flux2-1024,qwen-image-1328,hunyuan-video-544p,wan1.3b-480p} > $OUT/sweep_qk_tma.log 2>&1; grep -E "BEST|per-token|Error|error" $OUT/sweep_qk_tma.log | head -40
step 260 python3 benchmarks/sweep_attention.py > $OUT/sweep_attention.log 2>&1; grep -E "BEST|Error" $OUT/sweep_attention.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
