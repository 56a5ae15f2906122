#!/usr/bin/env bash
# Session 11, second call: cache hints A/B (benchmarks/tree_times.py, CUDA graphs, alternating
# twice). Trees: ab/main (HEAD's src); ab/h: x loads evict_first and streaming stores in the
# per-token QK kernel, the AdaLN kernels, GroupNorm's apply / fit kernels and the channel RMS,
# GroupNorm's statistics loads evict_last (g2); ab/g1: GroupNorm statistics evict_last, apply
# evict_first + streaming stores only; ab/g3: g2 without the statistics' evict_last.
source benchmarks/device_env.sh
BUDGET=580
QK=qk:flux1-1024,flux2-1024,qwen-image-1328,hunyuan-video-544p,sa3-dit,same-l-decoder
AD=adaln:flux1-1024,flux2-1024,wan14b-480p
GN=gn:flux-vae-out-1024,flux-vae-up2-512,flux-vae-up1-256,flux-vae-mid-128,hunyuan-vae-up-9f,hunyuan-vae-mid,wan-vae-out-480p,wan-vae-mid-480p
GNS=gn:flux-vae-up2-512,flux-vae-up1-256,flux-vae-mid-128,hunyuan-vae-up-9f,hunyuan-vae-mid
run() { step $1 env PYTHONPATH=/tmp/site:$PWD/ab/$2/src python3 benchmarks/tree_times.py "${@:2}" 2>&1 | grep -v Warn | tee -a $OUT/tree_times.log; }
for r in 1 2; do
  run 110 main $QK $AD $GN
  run 110 h $QK $AD $GN
  run 40 g1 $GNS
  run 40 g3 $GNS
done
echo "seconds used by the steps: $(( SECONDS - T0 ))"
