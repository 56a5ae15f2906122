#!/usr/bin/env bash
# Session 21, fifth call: register caps for the AdaLN tile kernel and the fp32 channel RMS
# (adaln_caps.py), then the bench's channel-RMS rows (the 16-bit cap of 80) in bf16 / fp16 /
# fp32 at both Wan VAE shapes.
source benchmarks/device_env.sh
BUDGET=420
step 200 python3 benchmarks/adaln_caps.py > $OUT/adaln_caps.log 2>&1; cat $OUT/adaln_caps.log
step 180 python3 -m ditfuse bench --op group_norm --shapes wan-vae-out-480p,wan-vae-mid-480p --dtypes bf16,fp16,fp32 --extra-dtypes "" --out-dir $OUT/bench_rms > $OUT/bench_rms.log 2>&1; grep -E "ditfuse-graph|copy|compile" $OUT/bench_rms.log | tail -18
echo "seconds used by the steps: $(( SECONDS - T0 ))"
