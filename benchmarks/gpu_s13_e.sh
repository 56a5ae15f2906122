#!/usr/bin/env bash
# Session 13, last call: the compile tests on the GPU with the tiny models on CUDA (the
# joint-row / GELU assertions of test_patch now run on the kernels' device).
source benchmarks/device_env.sh
BUDGET=300
step 280 python3 -m pytest tests/test_qk_library.py tests/test_activations.py tests/test_patch.py tests/test_e2e.py -p no:cacheprovider -q --tb=short -k "compile or joint_qk or opcheck or cat_activation or out_ops or loop_timer" > $OUT/pytest_compile.log 2>&1; tail -3 $OUT/pytest_compile.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
