#!/usr/bin/env bash
# Session 17, call g: the patched-model tests on the H200 after the session's processor
# changes (Wan / HunyuanVideo / FLUX.2 Q and K into fresh tensors): diffusers' processors
# against the patched ones, sibling models, hooks, context / head parallel, registry shapes.
source benchmarks/device_env.sh
BUDGET=330
step 320 python3 -m pytest tests/test_qk_norm_rope_diffusers.py tests/test_patch_siblings.py tests/test_patch_hooks.py tests/test_patch_shapes.py tests/test_context_parallel.py tests/test_head_parallel.py -p no:cacheprovider -q --tb=short > $OUT/pytest_patched.log 2>&1; tail -n 3 $OUT/pytest_patched.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
