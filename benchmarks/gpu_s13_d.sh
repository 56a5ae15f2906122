#!/usr/bin/env bash
# Session 13, fourth call: the out= ops under inductor on the GPU (tests), then the e2e rows
# of FLUX.1 (single blocks' GELU now written into the concat buffer under compile too) and
# HunyuanVideo with the settled timer.
source benchmarks/device_env.sh
BUDGET=560
step 150 python3 -m pytest tests/test_qk_library.py tests/test_activations.py tests/test_patch.py -p no:cacheprovider -q -x --tb=short -k "compile or joint_qk or opcheck or cat_activation or out_ops" > $OUT/pytest_compile.log 2>&1; tail -3 $OUT/pytest_compile.log
step 400 python3 -m ditfuse bench --e2e --models flux1-1024,hunyuan-video-544p --layers 4 --out-dir $OUT/l4 2>&1 | grep -v Warn > $OUT/e2e_l4.log; grep -E "eager|compile| s$|FAIL|Error" $OUT/e2e_l4.log | cut -c1-110
echo "seconds used by the steps: $(( SECONDS - T0 ))"
