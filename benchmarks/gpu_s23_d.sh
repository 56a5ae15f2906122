#!/usr/bin/env bash
# Session 23, last call: the fp32 attention entries on two-warp split_pv tiles -- every
# attention test, the AOT package's GPU tests (driver launch bitwise the JIT call, graph
# replay, launch-time parity) and 100 randomized cases on the H200; then the fp32 bench rows.
source benchmarks/device_env.sh
BUDGET=560
step 160 python3 -m pytest tests/test_attention.py -p no:cacheprovider -q --tb=short > $OUT/pytest_attn.log 2>&1; tail -n 3 $OUT/pytest_attn.log
step 90 python3 -m pytest tests/test_aot.py -k "gpu or attention" -p no:cacheprovider -q --tb=short > $OUT/pytest_aot_gpu.log 2>&1; tail -n 3 $OUT/pytest_aot_gpu.log
DITFUSE_FUZZ_N=100 step 120 python3 -m pytest tests/test_attention_fuzz.py -p no:cacheprovider -q --tb=short > $OUT/pytest_attn_fuzz.log 2>&1; tail -n 3 $OUT/pytest_attn_fuzz.log
step 150 python3 -m ditfuse bench --op attention --shapes same-l-8704,same-l-trt,same-l-8704-plain,same-l-32946 --dtypes fp32 --extra-dtypes "" --impls ditfuse,ditfuse-graph,copy --out-dir $OUT/bench_attn32 > $OUT/bench_attn32.log 2>&1; grep -E "ditfuse" $OUT/bench_attn32.log | tail -8
rm -f $OUT/*/*.png
echo "seconds used by the steps: $(( SECONDS - T0 ))"
