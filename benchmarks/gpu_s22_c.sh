#!/usr/bin/env bash
# Session 22, third call: the channels-last statistics as per-slot Welford accumulators (one
# cross-thread merge a program), 64 channel lanes a tile; GPU tests of GroupNorm and the VAE
# patch (4-D pairs on the kernel under torch.compile); times against contiguous input and
# torch.compile; the bench's channels-last rows; FLUX.1's decode eager / compiled.
source benchmarks/device_env.sh
BUDGET=580
step 170 python3 -m pytest -q -x tests/test_group_norm.py tests/test_patch_vae.py -p no:cacheprovider > $OUT/pytest_gn_vae.log 2>&1; tail -3 $OUT/pytest_gn_vae.log
cd benchmarks
step 100 python3 gn_layout.py flux-vae-mid-128 flux-vae-up1-256 flux-vae-up2-512 flux-vae-out-1024 hunyuan-vae-mid hunyuan-vae-up-9f > $OUT/gn_layout.log 2>&1; cat $OUT/gn_layout.log
LAUNCH='{"cl_lanes": 32}' NOCOMPILE=1 step 40 python3 gn_layout.py flux-vae-mid-128 flux-vae-up1-256 flux-vae-up2-512 flux-vae-out-1024 hunyuan-vae-up-9f > $OUT/gn_layout_lanes32.log 2>&1; sed "s/^/lanes 32: /" $OUT/gn_layout_lanes32.log
step 130 python3 vae_e2e.py flux-1024 --compile > $OUT/vae_e2e_flux.log 2>&1; grep -v Warn $OUT/vae_e2e_flux.log | tail -2
cd ..
step 120 python3 -m ditfuse bench --op group_norm --shapes flux-vae-mid-128-cl,flux-vae-up1-256-cl,flux-vae-up2-512-cl,flux-vae-out-1024-cl --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench_gn_cl > $OUT/bench_gn_cl.log 2>&1; grep -E "ditfuse|compile" $OUT/bench_gn_cl.log | tail -10
echo "seconds used by the steps: $(( SECONDS - T0 ))"
