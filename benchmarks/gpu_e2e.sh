#!/usr/bin/env bash
# The end-to-end device call (issue 7): the patched models in CUDA graphs (GPU test), then
# whole transformers unpatched/patched x eager/compile in interleaved rounds, 20-step
# trajectory PSNR (MODELS, default Wan-14B 480p, FLUX.1, FLUX.2; 2 blocks). Carry .whl
# (diffusers); copy $OUT into benchmarks/results and benchmarks/logs.
source benchmarks/device_env.sh
timeout 90 python3 -m pytest tests/test_patch_cuda_graph.py -v -p no:cacheprovider --tb=short -rs \
  > $OUT/pytest_cuda_graph.log 2>&1; grep -E "PASS|FAIL|SKIP|passed|failed" $OUT/pytest_cuda_graph.log | tail -12
timeout ${E2E_S:-450} python3 -m ditfuse bench --e2e --models ${MODELS:-wan14b-480p,flux1-1024,flux2-1024} \
  --layers 2 --out-dir $OUT 2>&1 | grep -v Warn | tee $OUT/e2e.log | tail -20
