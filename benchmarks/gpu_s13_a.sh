#!/usr/bin/env bash
# Session 13, first call: where patched + compile loses to patched eager (issue 7's "faster
# still with both"): kernel lists of both at FLUX.2, Qwen-Image, FLUX.1 (4 blocks; FLUX:
# + 8 single), with qk_norm_rope's out= now a mutating op under compile; the compile /
# out= tests on the GPU (inductor's CUDA code).
source benchmarks/device_env.sh
BUDGET=560
step 120 python3 -m pytest tests/test_qk_library.py tests/test_patch.py -p no:cacheprovider -q -x --tb=short -k "compile or joint_qk or opcheck" > $OUT/pytest_compile.log 2>&1; tail -3 $OUT/pytest_compile.log
for m in flux2-1024 qwen-image-1328 flux1-1024; do
  step 150 python3 benchmarks/profile_e2e.py $m 4 patched > $OUT/profile_$m.log 2>&1; grep "^==" $OUT/profile_$m.log
done
echo "seconds used by the steps: $(( SECONDS - T0 ))"
