#!/usr/bin/env bash
# Session 11, third call: which cache hints help the per-token QK kernel (trees ab/q1: x
# loads evict_first, tables / weights evict_last, streaming stores; q2: without the
# evict_last; q3: streaming stores only; q4: evict_first x loads only), against ab/main;
# GroupNorm with session 11's hints (src: statistics loads evict_last, apply loads
# evict_first, streaming stores) against ab/main at every registry GroupNorm shape.
source benchmarks/device_env.sh
BUDGET=580
QK=qk:flux1-1024,flux2-1024,qwen-image-1328,hunyuan-video-544p,sa3-dit,same-l-decoder
GN=gn:flux-vae-out-1024,flux-vae-up2-512,flux-vae-up1-256,flux-vae-mid-128,hunyuan-vae-up-9f,hunyuan-vae-mid
run() { local t=$1 d=$PWD/ab/$2/src; [ $2 = src ] && d=$PWD/src; step $t env PYTHONPATH=/tmp/site:$d python3 benchmarks/tree_times.py "${@:2}" 2>&1 | grep -v Warn | tee -a $OUT/tree_times.log; }
for r in 1 2; do
  for t in main q1 q2 q3 q4; do run 50 $t $QK; done
  run 40 main $GN
  run 40 src $GN
done
for t in main q2 q4; do run 50 $t $QK --dtype fp32; done
echo "seconds used by the steps: $(( SECONDS - T0 ))"
