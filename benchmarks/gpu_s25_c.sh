#!/usr/bin/env bash
# Session 25, call c: the shipped kernel (per-row reciprocals only; the fma softmax step of
# call b reverted) -- GPU attention tests, the AOT package's GPU tests, 100 randomized
# attention cases, the bench's attention rows (bf16 + fp16 with FlexAttention, fp32), the
# A/B once more.
source benchmarks/device_env.sh
BUDGET=560
step 100 python3 -m pytest -q tests/test_attention.py -p no:cacheprovider --tb=short > $OUT/pytest_attention.log 2>&1; tail -n 2 $OUT/pytest_attention.log
step 90 python3 -m pytest -q tests/test_aot.py -k "gpu or attention" -p no:cacheprovider --tb=short > $OUT/pytest_aot_gpu.log 2>&1; tail -n 2 $OUT/pytest_aot_gpu.log
DITFUSE_FUZZ_N=100 step 90 python3 -m pytest -q tests/test_attention_fuzz.py -p no:cacheprovider --tb=short > $OUT/pytest_attn_fuzz.log 2>&1; tail -n 2 $OUT/pytest_attn_fuzz.log
step 110 python3 -m ditfuse bench --op attention --shapes same-l-8704,same-l-trt,same-l-8704-plain,same-l-32946 --dtypes bf16 --extra-dtypes fp16 --impls ditfuse,ditfuse-graph,copy,flex --out-dir $OUT/bench_attn16 > $OUT/bench_attn16.log 2>&1; grep -E "ditfuse|flex" $OUT/bench_attn16.log | tail -14
step 80 python3 -m ditfuse bench --op attention --shapes same-l-8704,same-l-trt,same-l-8704-plain,same-l-32946 --dtypes fp32 --extra-dtypes "" --impls ditfuse,ditfuse-graph,copy --out-dir $OUT/bench_attn32 > $OUT/bench_attn32.log 2>&1; grep -E "ditfuse" $OUT/bench_attn32.log | tail -8
step 90 python3 benchmarks/attn_epilogue_ab.py --rounds 3 > $OUT/attn_epilogue_ab.log 2>&1; grep -v "max|d|" $OUT/attn_epilogue_ab.log | tail -22
rm -f $OUT/*/*.png
echo "seconds used by the steps: $(( SECONDS - T0 ))"
