#!/usr/bin/env bash
# Session 12, third call: launch settings for head_dim 128 differential attention (the table's
# entry holds one 8-warp program a SM: 362 us at SAME-L's N, logs/s12/b/attn_padded.log), then
# the e2e rows of HunyuanVideo 544p 61 frames (4 dual-stream + 8 single-stream blocks): the
# dual-stream processor that writes each stream into the joint Q / K (session 11, not measured
# then) against unpatched eager and torch.compile.
source benchmarks/device_env.sh
BUDGET=570
step 110 python3 benchmarks/attn_d128_sweep.py 2>&1 | grep -v Warn | tee $OUT/attn_d128_sweep.log
step 450 python3 -m ditfuse bench --e2e --models hunyuan-video-544p --layers 4 --out-dir $OUT/l4 2>&1 | grep -v Warn > $OUT/e2e_hunyuan.log; grep -E "eager|compile|s$|FAIL|Error" $OUT/e2e_hunyuan.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
