#!/usr/bin/env bash
# Session 18, call b: more tiles with a query step (sweep_attention.py --s18b: 128 queries on
# two warpgroups, 32 on two warps), then the attention / AOT / fast-path tests and 150
# randomized attention cases on the H200 with the step in the table.
source benchmarks/device_env.sh
BUDGET=570
step 150 python3 benchmarks/sweep_attention.py --s18b --cases=same-l-8704:bf16,same-l-32946:bf16,same-l-trt:bf16,same-l-8704-plain:bf16 > $OUT/sweep_attention_s18b_bf16.log 2>&1; grep -E "us|BEST" $OUT/sweep_attention_s18b_bf16.log
step 150 python3 benchmarks/sweep_attention.py --s18b --cases=same-l-8704:fp32,same-l-trt:fp32,same-l-32946:fp32,same-l-8704-plain:fp32 > $OUT/sweep_attention_s18b_fp32.log 2>&1; grep -E "us|BEST" $OUT/sweep_attention_s18b_fp32.log
step 150 python3 -m pytest tests/test_attention.py tests/test_aot.py tests/test_fastpath.py -p no:cacheprovider -q --tb=short > $OUT/pytest_attn.log 2>&1; tail -n 3 $OUT/pytest_attn.log
DITFUSE_FUZZ_N=150 step 100 python3 -m pytest tests/test_attention_fuzz.py -p no:cacheprovider -q --tb=short > $OUT/pytest_attn_fuzz.log 2>&1; tail -n 3 $OUT/pytest_attn_fuzz.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
