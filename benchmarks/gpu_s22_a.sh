#!/usr/bin/env bash
# Session 22, first call: GroupNorm on channels-last input (gn_layout.py); the statistics
# programs at the under-filled split shapes (gn_times.py, LAUNCH); where FLUX.1's compiled VAE
# decode loses with the kernels in the graph (vae_compile_profile.py); the bench rows that
# predate the eager fast path (AdaLN FLUX.1 fp16 / fp32, QK same-l-decoder fp16 / fp32).
source benchmarks/device_env.sh
BUDGET=560
cd benchmarks
step 120 python3 gn_layout.py > $OUT/gn_layout.log 2>&1; cat $OUT/gn_layout.log
S="flux-vae-up1-256 hunyuan-vae-up-9f flux-vae-up2-512 flux-vae-mid-128 flux-vae-out-1024"
for r in 1 2; do
  step 40 python3 gn_times.py table $S >> $OUT/gn_stats.log 2>&1
  for p in 2048 4096; do
    LAUNCH="{\"stats_programs\": $p}" step 40 python3 gn_times.py sp$p $S >> $OUT/gn_stats.log 2>&1
  done
done
cat $OUT/gn_stats.log
step 240 python3 vae_compile_profile.py > $OUT/vae_compile_profile.log 2>&1; grep -E "^==|layouts|^  \(" $OUT/vae_compile_profile.log | head -40
cd ..
step 150 python3 -m ditfuse bench --op adaln --shapes flux1-1024 --dtypes fp16,fp32 --extra-dtypes "" --out-dir $OUT/bench_adaln > $OUT/bench_adaln.log 2>&1; grep -E "ditfuse|compile" $OUT/bench_adaln.log | tail -16
echo "seconds used by the steps: $(( SECONDS - T0 ))"
