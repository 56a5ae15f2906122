#!/usr/bin/env bash
# Session 16, call f: the gated residual alone on a flat elementwise kernel (dense rows)
# against the tile kernel and torch.compile, then the AdaLN bench rows (bf16).
source benchmarks/device_env.sh
BUDGET=330
step 120 python3 benchmarks/sweep_residual.py 2>&1 | grep -v Warn | tee $OUT/sweep_residual.log
step 100 python3 -m ditfuse bench --op adaln --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench_adaln > $OUT/bench_adaln.log 2>&1; grep -E "gated_residual .*ditfuse-graph" $OUT/bench_adaln.log | tail -5
step 60 python3 -m pytest tests/test_adaln.py -k "gated_residual" -p no:cacheprovider -q -x --tb=short > $OUT/pytest_residual.log 2>&1; tail -n 2 $OUT/pytest_residual.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
