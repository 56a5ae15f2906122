#!/usr/bin/env bash
# Session 4's last call: the GPU tests the measuring call failed (fixed since), the
# activation launch sweep, then e2e at 2 and 4 blocks (the difference is the per-block
# cost, free of the step's fixed prologue). Every step bounded by what remains of BUDGET.
# Carry .whl; copy $OUT into benchmarks/results and benchmarks/logs.
source benchmarks/device_env.sh
M=${MODELS:-wan14b-480p,flux1-1024,flux2-1024}
step 60 python3 -m pytest tests/test_qk_tma.py tests/test_aot.py -p no:cacheprovider --tb=short -q \
  -k "where_tma or launch_time" > $OUT/pytest_gpu_fixed.log 2>&1; tail -3 $OUT/pytest_gpu_fixed.log
step 70 python3 benchmarks/sweep_act.py > $OUT/sweep_act.log 2>&1; grep -E "BEST|compile|Error" $OUT/sweep_act.log
step 190 python3 -m ditfuse bench --e2e --models $M --layers 2 --out-dir $OUT/l2 2>&1 | grep -v Warn > $OUT/e2e_l2.log; grep -E "eager|compile" $OUT/e2e_l2.log
step 230 python3 -m ditfuse bench --e2e --models $M --layers 4 --out-dir $OUT/l4 2>&1 | grep -v Warn > $OUT/e2e_l4.log; grep -E "eager|compile" $OUT/e2e_l4.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
