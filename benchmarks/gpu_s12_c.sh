#!/usr/bin/env bash
# Session 12, third call: the e2e rows of HunyuanVideo 544p 61 frames (4 dual-stream + 8
# single-stream blocks): the dual-stream processor that writes each stream into the joint Q /
# K (session 11, not measured then) against unpatched eager and torch.compile.
source benchmarks/device_env.sh
BUDGET=570
step 560 python3 -m ditfuse bench --e2e --models hunyuan-video-544p --layers 4 --out-dir $OUT/l4 2>&1 | grep -v Warn > $OUT/e2e_hunyuan.log; grep -E "eager|compile|s$" $OUT/e2e_hunyuan.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
