#!/usr/bin/env bash
# Session 16, call c: two tokens a program in the flat pair form (A/B), the fp32 attention
# entry (16-query one-warp tiles) under the GPU tests and in the bench, the QK / attention
# bench rows that change.
source benchmarks/device_env.sh
# flat_tokens_ab.py and the TOKENS code were removed after this call (LOST): logs/s16/c/flat_tokens.diff
BUDGET=560
step 90 python3 benchmarks/flat_tokens_ab.py wan1.3b-480p wan5b-ti2v-704p wan14b-480p --all-warps 2>&1 | grep -v Warn | tee $OUT/flat_tokens_ab.log
step 150 python3 -m pytest tests/test_attention.py tests/test_qk_flat.py -p no:cacheprovider -q -x --tb=short > $OUT/pytest_attn_flat.log 2>&1; tail -3 $OUT/pytest_attn_flat.log
DITFUSE_FUZZ_N=150 step 90 python3 -m pytest tests/test_attention_fuzz.py -p no:cacheprovider -q -x --tb=short > $OUT/pytest_attn_fuzz.log 2>&1; tail -2 $OUT/pytest_attn_fuzz.log
step 120 python3 -m ditfuse bench --op attention --shapes same-l-8704,same-l-trt,same-l-8704-plain --dtypes fp32 --extra-dtypes "" --out-dir $OUT/bench_attn32 > $OUT/bench_attn32.log 2>&1; grep -E "ditfuse-graph" $OUT/bench_attn32.log | tail -4
step 90 python3 -m ditfuse bench --op qk_norm_rope --shapes wan1.3b-480p --dtypes bf16 --extra-dtypes fp16 --out-dir $OUT/bench_qk13 > $OUT/bench_qk13.log 2>&1; grep -E "ditfuse-graph" $OUT/bench_qk13.log | tail -2
echo "seconds used by the steps: $(( SECONDS - T0 ))"
