#!/usr/bin/env bash
# Session 17, call b: (1) the Wan qk_norm_rope rows re-benched out of place (the patched
# processor's new call; call a measured it faster at every Wan shape, same bits); (2) in place
# against out of place where other patched processors still normalise in place (HunyuanVideo's
# single-stream rows, SA3, FLUX.2's single-stream chunks); (3) the AdaLN tile kernel's launch
# settings at the FLUX shapes.
source benchmarks/device_env.sh
BUDGET=570
W=wan14b-480p,wan14b-720p,wan1.3b-480p,wan5b-ti2v-704p,wan14b-480p-fused,wan14b-720p-fused
step 150 python3 -m ditfuse bench --op qk_norm_rope --shapes $W --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench_qk > $OUT/bench_qk.log 2>&1; grep -E "ditfuse-graph" $OUT/bench_qk.log | tail -6
step 100 python3 -m ditfuse bench --op qk_norm_rope --shapes wan14b-480p --dtypes fp16,fp32 --extra-dtypes "" --out-dir $OUT/bench_qk14 > $OUT/bench_qk14.log 2>&1; grep -E "ditfuse-graph" $OUT/bench_qk14.log | tail -2
step 100 python3 -m ditfuse bench --op qk_norm_rope --shapes wan1.3b-480p,wan5b-ti2v-704p --dtypes fp32,fp16 --extra-dtypes "" --impls copy,ditfuse,ditfuse-graph --out-dir $OUT/bench_qk32 > $OUT/bench_qk32.log 2>&1; grep -E "ditfuse-graph" $OUT/bench_qk32.log | tail -4
step 90 python3 benchmarks/wan_out_ab.py --dtypes=bf16 --rounds=2 --shapes=hunyuan-video-544p,sa3-dit,flux2-1024+packed=9 > $OUT/out_ab_others.log 2>&1; cat $OUT/out_ab_others.log
step 100 python3 benchmarks/sweep_adaln.py --shapes=flux1-1024,flux2-1024 1,2 1,4 1,8 1,16 2,4 2,8 4,8 > $OUT/sweep_adaln_flux.log 2>&1; grep BEST $OUT/sweep_adaln_flux.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
