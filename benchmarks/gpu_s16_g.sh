#!/usr/bin/env bash
# Session 16, call g: the AdaLN bench rows (bf16) with the flat residual kernel's swept
# setting (1024 values, 4 warps), and its GPU tests.
source benchmarks/device_env.sh
BUDGET=200
step 80 python3 -m ditfuse bench --op adaln --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench_adaln > $OUT/bench_adaln.log 2>&1; grep -E "gated_residual .*(ditfuse-graph|compile )" $OUT/bench_adaln.log | tail -12
step 60 python3 -m pytest tests/test_adaln.py -k "gated_residual" -p no:cacheprovider -q --tb=short > $OUT/pytest_residual.log 2>&1; tail -n 2 $OUT/pytest_residual.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
