#!/usr/bin/env bash
# Session 5's e2e call after FLUX.1's single blocks stopped re-concatenating their input:
# the join test on the GPU, then the e2e table at 4 blocks (5 interleaved rounds, steps
# back to back). Carry .whl.
source benchmarks/device_env.sh
step 60 python3 -m pytest tests/test_join_tokens.py -p no:cacheprovider --tb=short -q > $OUT/pytest_gpu_join.log 2>&1; tail -2 $OUT/pytest_gpu_join.log
step 420 python3 -m ditfuse bench --e2e --models ${MODELS:-flux1-1024,flux2-1024,wan14b-480p} --layers 4 --out-dir $OUT/l4 2>&1 | grep -v Warn > $OUT/e2e_l4.log; grep -E "eager|compile" $OUT/e2e_l4.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
