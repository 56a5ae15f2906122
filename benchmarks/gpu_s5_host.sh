#!/usr/bin/env bash
# Session 5's first call: where an eager ditfuse call's host time goes on the GPU machine
# (host_cost_gpu.py, cProfile of each op), and a patched eager FLUX.1 step's host time
# against its step time (diag_eager.py). Carry .whl.
source benchmarks/device_env.sh
step 150 python3 benchmarks/host_cost_gpu.py --profile > $OUT/host_cost.log 2>&1; grep " us" $OUT/host_cost.log | head -12
step 200 python3 benchmarks/diag_eager.py flux1-1024 4 2>&1 | grep -v Warn > $OUT/diag_eager_flux1.log; tail -4 $OUT/diag_eager_flux1.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
