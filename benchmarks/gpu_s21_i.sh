#!/usr/bin/env bash
# Session 21, ninth call: the VAE patch tests on the GPU (fp32 comparisons without TF32
# convolutions), then FLUX.1's VAE decode compiled, unpatched and patched.
source benchmarks/device_env.sh
BUDGET=330
step 100 python3 -m pytest tests/test_patch_vae.py -p no:cacheprovider -q --tb=short > $OUT/pytest_vae.log 2>&1; tail -n 3 $OUT/pytest_vae.log
step 200 python3 benchmarks/vae_e2e.py --compile flux-1024 > $OUT/vae_e2e_compile.log 2>&1; grep flux $OUT/vae_e2e_compile.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
