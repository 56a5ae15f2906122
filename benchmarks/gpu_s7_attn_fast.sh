#!/usr/bin/env bash
# Session 7, last call: replayed attention calls on the H200: fast-path + attention tests on
# CUDA, then the attention bench rows (the "ditfuse" column is the eager call).
source benchmarks/device_env.sh
BUDGET=230 step 220 python3 -m pytest tests/test_fastpath.py tests/test_attention.py -p no:cacheprovider -q --tb=short -rs \
  > $OUT/pytest_fast_attn.log 2>&1; tail -3 $OUT/pytest_fast_attn.log
BUDGET=330 step 100 python3 -m ditfuse bench --op attention --out-dir $OUT/bench_attn > $OUT/bench_attn.log 2>&1
grep -E "ditfuse" $OUT/bench_attn.log | head -30
echo "seconds used by the steps: $(( SECONDS - T0 ))"
