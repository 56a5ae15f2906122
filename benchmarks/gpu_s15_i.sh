#!/usr/bin/env bash
# Session 15 i: the qk_norm_rope bench at every registry shape (v11 Wan, v12 per-token word
# form), bf16 and the extra dtypes; the QK GPU tests.
source benchmarks/device_env.sh
BUDGET=520
step 330 python3 -m ditfuse bench --op qk_norm_rope --dtypes bf16 --out-dir $OUT/bench_qk > $OUT/bench_qk.log 2>&1; grep -E "ditfuse-graph" $OUT/bench_qk.log | tail -20
step 180 python3 -m pytest tests/test_qk_token_words.py tests/test_qk_fuzz.py tests/test_qk_flat.py -p no:cacheprovider -q --tb=short -x > $OUT/pytest_qk.log 2>&1; tail -3 $OUT/pytest_qk.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
