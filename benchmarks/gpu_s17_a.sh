#!/usr/bin/env bash
# Session 17, call a: (1) Wan's qk_norm_rope in place against out of place at every Wan
# registry shape (benchmarks/wan_out_ab.py); (2) bf16 attention on 32 / 64 queries of one or
# two mma.sync warps (sweep_attention.py --s17); (3) the attention / flat QK tests that
# session 16's calls cut by time.
source benchmarks/device_env.sh
BUDGET=570
step 150 python3 benchmarks/wan_out_ab.py --dtypes=bf16 --rounds=2 > $OUT/wan_out_ab.log 2>&1; cat $OUT/wan_out_ab.log
step 90 python3 benchmarks/wan_out_ab.py --dtypes=fp16,fp32 --rounds=1 --shapes=wan14b-480p,wan1.3b-480p,wan5b-ti2v-704p > $OUT/wan_out_ab_32.log 2>&1; cat $OUT/wan_out_ab_32.log
step 150 python3 benchmarks/sweep_attention.py --s17 --cases=same-l-8704:bf16,same-l-32946:bf16,same-l-trt:bf16,same-l-8704-plain:bf16 > $OUT/sweep_attention_s17.log 2>&1; grep -E "us|BEST" $OUT/sweep_attention_s17.log
DITFUSE_FUZZ_N=300 step 170 python3 -m pytest tests/test_attention_fuzz.py tests/test_qk_flat.py -p no:cacheprovider -q -x --tb=short > $OUT/pytest_attn_fuzz.log 2>&1; tail -n 2 $OUT/pytest_attn_fuzz.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
