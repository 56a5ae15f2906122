#!/usr/bin/env bash
# Session 5's second call: replayed launches (ditfuse/_fastpath.py) on the GPU — their tests
# (the C-launcher replay only runs there) and the ops' GPU tests, the host cost of a call
# now, then the e2e table at 4 blocks (FLUX.1 was host-bound). Carry .whl.
source benchmarks/device_env.sh
step 170 python3 -m pytest tests/test_fastpath.py tests/test_adaln.py tests/test_activations.py \
  -p no:cacheprovider --tb=short -rs -q -x > $OUT/pytest_gpu_fast.log 2>&1; tail -4 $OUT/pytest_gpu_fast.log
step 60 python3 benchmarks/host_cost_gpu.py > $OUT/host_cost.log 2>&1; grep " us" $OUT/host_cost.log | head -12
step 280 python3 -m ditfuse bench --e2e --models ${MODELS:-flux1-1024,flux2-1024,wan14b-480p} --layers 4 --out-dir $OUT/l4 2>&1 | grep -v Warn > $OUT/e2e_l4.log; grep -E "eager|compile" $OUT/e2e_l4.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
