#!/usr/bin/env bash
# Session 18, call a: (1) a program storing fewer queries than its tile (step_m: 62 of 64 at
# window 17 spans 3 key tiles of 32 instead of 4; 14 of 16 spans 3 tiles of 16), bf16 and fp32
# SAME-L cases (sweep_attention.py --s18); (2) the AdaLN GPU tests session 17 cut by time.
source benchmarks/device_env.sh
BUDGET=570
step 190 python3 benchmarks/sweep_attention.py --s18 --cases=same-l-8704:bf16,same-l-32946:bf16,same-l-trt:bf16,same-l-8704-plain:bf16 > $OUT/sweep_attention_s18_bf16.log 2>&1; grep -E "us|BEST" $OUT/sweep_attention_s18_bf16.log
step 190 python3 benchmarks/sweep_attention.py --s18 --cases=same-l-8704:fp32,same-l-trt:fp32,same-l-32946:fp32,same-l-8704-plain:fp32 > $OUT/sweep_attention_s18_fp32.log 2>&1; grep -E "us|BEST" $OUT/sweep_attention_s18_fp32.log
step 170 python3 -m pytest tests/test_adaln.py -p no:cacheprovider -q --tb=short > $OUT/pytest_adaln.log 2>&1; tail -n 2 $OUT/pytest_adaln.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
