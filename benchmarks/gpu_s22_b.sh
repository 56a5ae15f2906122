#!/usr/bin/env bash
# Session 22, second call: the channels-last GroupNorm path ("split-cl") on the H200 -- its
# tests, its times against contiguous input and torch.compile (gn_layout.py, and the channel
# lanes a tile), and FLUX.1's / HunyuanVideo's compiled VAE decode with the kernels in the graph.
source benchmarks/device_env.sh
BUDGET=570
step 150 python3 -m pytest -q -x tests/test_group_norm.py -p no:cacheprovider > $OUT/pytest_gn.log 2>&1; tail -3 $OUT/pytest_gn.log
cd benchmarks
step 120 python3 gn_layout.py > $OUT/gn_layout.log 2>&1; cat $OUT/gn_layout.log
for l in 64 256; do
  LAUNCH="{\"cl_lanes\": $l}" NOCOMPILE=1 step 40 python3 gn_layout.py flux-vae-mid-128 flux-vae-up1-256 flux-vae-up2-512 flux-vae-out-1024 hunyuan-vae-up-9f > $OUT/gn_layout_lanes$l.log 2>&1; sed "s/^/lanes $l: /" $OUT/gn_layout_lanes$l.log
done
step 150 python3 vae_compile_profile.py flux-1024 --tables > $OUT/vae_compile_flux.log 2>&1; grep -E "^==|^max|^  \(" $OUT/vae_compile_flux.log | head -20
step 150 python3 vae_compile_profile.py hunyuan-256-9f > $OUT/vae_compile_hunyuan.log 2>&1; grep -E "^==|^max|^  \(" $OUT/vae_compile_hunyuan.log | head -20
echo "seconds used by the steps: $(( SECONDS - T0 ))"
