#!/usr/bin/env bash
# Session 25, call d (last): the running max from -FLT_MAX and the head count as a constant
# (the same bits as call c's kernel) -- the A/B against calls b-c's kernel and session 24's,
# then the GPU attention tests and the AOT package's GPU tests with the working tree's
# kernel, and the bench's attention rows.
source benchmarks/device_env.sh
BUDGET=380
step 90 python3 benchmarks/attn_epilogue_ab.py --rounds 3 > $OUT/attn_epilogue_ab.log 2>&1; grep -v "max|d|" $OUT/attn_epilogue_ab.log | tail -22; grep -c "bitwise epi's: False" $OUT/attn_epilogue_ab.log
step 120 python3 -m pytest -q tests/test_attention.py -p no:cacheprovider --tb=short > $OUT/pytest_attention.log 2>&1; tail -n 2 $OUT/pytest_attention.log
step 90 python3 -m pytest -q tests/test_aot.py -k "gpu or attention" -p no:cacheprovider --tb=short > $OUT/pytest_aot_gpu.log 2>&1; tail -n 2 $OUT/pytest_aot_gpu.log
step 80 python3 -m ditfuse bench --op attention --shapes same-l-8704,same-l-trt,same-l-8704-plain,same-l-32946 --dtypes bf16,fp32 --extra-dtypes "" --impls ditfuse,ditfuse-graph,copy --out-dir $OUT/bench_attn > $OUT/bench_attn.log 2>&1; grep -E "ditfuse" $OUT/bench_attn.log | tail -16
rm -f $OUT/*/*.png
echo "seconds used by the steps: $(( SECONDS - T0 ))"
