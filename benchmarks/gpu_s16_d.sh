#!/usr/bin/env bash
# Session 16, call d: the AOT packages on the GPU with the fp32 attention entry (16-query
# one-warp tiles: sm_80 / sm_90 PTX, the JIT's two stages), the fp32 bench row at SAME-L
# 32946, the attention tests and randomized cases the last call's step time cut, and
# `ditfuse check` at production shapes.
source benchmarks/device_env.sh
BUDGET=570
step 90 python3 -m pytest tests/test_aot.py -p no:cacheprovider -q -rs -s --tb=short > $OUT/pytest_aot.log 2>&1; tail -n 3 $OUT/pytest_aot.log; grep "not bitwise" $OUT/pytest_aot.log | head -5
step 90 python3 -m ditfuse bench --op attention --shapes same-l-32946 --dtypes fp32 --extra-dtypes "" --out-dir $OUT/bench_attn32946 > $OUT/bench_attn32946.log 2>&1; grep -E "ditfuse-graph|flex " $OUT/bench_attn32946.log | tail -3
step 150 python3 -m pytest tests/test_attention.py -p no:cacheprovider -q -x --tb=short > $OUT/pytest_attn.log 2>&1; tail -n 3 $OUT/pytest_attn.log
step 160 python3 -m ditfuse check --out $OUT/check_table.txt > $OUT/check.log 2>&1; tail -n 2 $OUT/check.log; grep "| FAIL" $OUT/check_table.txt | cut -c1-200
DITFUSE_FUZZ_N=100 step 80 python3 -m pytest tests/test_attention_fuzz.py -p no:cacheprovider -q -x --tb=short > $OUT/pytest_attn_fuzz.log 2>&1; tail -n 2 $OUT/pytest_attn_fuzz.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
