#!/usr/bin/env bash
# A session's first device call: the GPU-only tests (AOT packages bitwise vs the JIT, patched
# models in CUDA graphs, no half-precision FMA), where a patched Wan step's
# time goes (profile_e2e.py), the AdaLN v1/v3 sweep, the GroupNorm sweep; every step bounded
# by what remains of BUDGET seconds. Carry .whl; copy $OUT into benchmarks/logs.
source benchmarks/device_env.sh
step 170 python3 -m pytest tests/test_aot.py tests/test_patch_cuda_graph.py \
  tests/test_no_half_fma.py -q -p no:cacheprovider --tb=short -rs -k "gpu or cuda_graph or half" \
  > $OUT/pytest_gpu.log 2>&1; tail -15 $OUT/pytest_gpu.log
step 160 python3 benchmarks/profile_e2e.py ${PROFILE_ARGS:-wan14b-480p 2} > $OUT/profile_e2e.log 2>&1; grep -v Warn $OUT/profile_e2e.log | head -80
step 150 python3 benchmarks/sweep_adaln.py > $OUT/sweep_adaln.log 2>&1; grep BEST $OUT/sweep_adaln.log
step 90 python3 benchmarks/sweep_gn.py > $OUT/sweep_gn.log 2>&1; grep BEST $OUT/sweep_gn.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
