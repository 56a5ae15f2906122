#!/usr/bin/env bash
# Session 18, call d: fp32 one-warp tiles under register caps (sweep_attention.py --s18c), then
# on the H200 with the step in the table: the AOT tests (the package's grid now cdiv(N, 14),
# bitwise against the JIT call), the attention tests call b's step cut, 150 randomized cases.
source benchmarks/device_env.sh
BUDGET=400
step 120 python3 benchmarks/sweep_attention.py --s18c --cases=same-l-8704:fp32,same-l-trt:fp32,same-l-32946:fp32,same-l-8704-plain:fp32 > $OUT/sweep_attention_s18c_fp32.log 2>&1; grep -E "us|BEST" $OUT/sweep_attention_s18c_fp32.log
step 150 python3 -m pytest tests/test_aot.py tests/test_fastpath.py tests/test_attention.py -k "not test_randomized" -p no:cacheprovider -q --tb=short -x > $OUT/pytest_attn_aot.log 2>&1; tail -n 3 $OUT/pytest_attn_aot.log
DITFUSE_FUZZ_N=150 step 110 python3 -m pytest tests/test_attention_fuzz.py -p no:cacheprovider -q --tb=short > $OUT/pytest_attn_fuzz.log 2>&1; tail -n 3 $OUT/pytest_attn_fuzz.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
