#!/usr/bin/env bash
# Session 24, call f: with the channels-last statistics table (256 programs, tile counts not
# rounded): GPU tests of GroupNorm and the VAE patch; FLUX.1's decode eager / compiled
# (inductor hands the norms channels-last x); the bench's GroupNorm rows, both layouts;
# the channels-first statistics programs.
source benchmarks/device_env.sh
BUDGET=480
step 170 python3 -m pytest -q -x tests/test_group_norm.py tests/test_patch_vae.py -p no:cacheprovider > $OUT/pytest_gn_vae.log 2>&1; tail -3 $OUT/pytest_gn_vae.log
cd benchmarks
step 140 python3 vae_e2e.py flux-1024 --compile > $OUT/vae_e2e_flux.log 2>&1; grep -v Warn $OUT/vae_e2e_flux.log | tail -3
cd ..
step 160 python3 -m ditfuse bench --op group_norm --shapes flux-vae-mid-128,flux-vae-up1-256,flux-vae-up2-512,flux-vae-out-1024,hunyuan-vae-mid,hunyuan-vae-up-9f,flux-vae-mid-128-cl,flux-vae-up1-256-cl,flux-vae-up2-512-cl,flux-vae-out-1024-cl --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench_gn > $OUT/bench_gn.log 2>&1; grep -E "ditfuse-graph|compile" $OUT/bench_gn.log | tail -24
cd benchmarks
step 60 python3 gn_cl_profile.py --cf > $OUT/gn_cf_stats.log 2>&1; cat $OUT/gn_cf_stats.log
cd ..
rm -f $OUT/*/*.png
echo "seconds used by the steps: $(( SECONDS - T0 ))"
