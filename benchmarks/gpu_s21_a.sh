#!/usr/bin/env bash
# Session 21, first call: GroupNorm's chunked (pipelined) split path against the two-launch
# table at every GroupNorm registry shape (bf16, CUDA graphs), then the GroupNorm tests
# (the new pipelined cases included) and the sm_90 build tests on the GPU.
# (benchmarks/gn_pipe_sweep.py and the path it times were removed after this call: LOST;
# both are in benchmarks/logs/s21/a/gn_pipe.diff)
source benchmarks/device_env.sh
BUDGET=560
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv > $OUT/gpu.txt
step 420 python3 benchmarks/gn_pipe_sweep.py > $OUT/gn_pipe_sweep.log 2>&1; cat $OUT/gn_pipe_sweep.log
step 120 python3 -m pytest tests/test_group_norm.py -p no:cacheprovider -q --tb=short -k "pipelined or split" > $OUT/pytest_gn.log 2>&1; tail -n 3 $OUT/pytest_gn.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
