#!/usr/bin/env bash
# Session 21, eighth call: VAE decode patched (norm -> SiLU pairs on the kernels) vs
# unpatched at production configurations (vae_e2e.py), then with torch.compile of the
# unpatched decoder at FLUX.1 1024^2; the VAE patch tests on the GPU.
source benchmarks/device_env.sh
BUDGET=400
step 170 python3 benchmarks/vae_e2e.py > $OUT/vae_e2e.log 2>&1; cat $OUT/vae_e2e.log
step 60 python3 -m pytest tests/test_patch_vae.py -p no:cacheprovider -q --tb=short -x > $OUT/pytest_vae.log 2>&1; tail -n 3 $OUT/pytest_vae.log
step 150 python3 benchmarks/vae_e2e.py --compile flux-1024 > $OUT/vae_e2e_compile.log 2>&1; cat $OUT/vae_e2e_compile.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
