#!/usr/bin/env bash
# Session 29, call c: the library's fp32 Gluon route -- A/B (public call with the route on /
# off, the kernel launched directly, the 72 KB ring form), its GPU tests, the replay tests,
# then the bench's fp32 attention rows.
source benchmarks/device_env.sh
BUDGET=560
step 100 python3 benchmarks/attn_gluon_fp32_s29.py --rounds 5 > $OUT/attn_gluon_fp32_s29.log 2>&1; tail -4 $OUT/attn_gluon_fp32_s29.log
step 90 python3 -m pytest -q tests/test_attention_gluon.py -p no:cacheprovider --tb=short -rA > $OUT/pytest_attention_gluon.log 2>&1; tail -n 2 $OUT/pytest_attention_gluon.log
step 60 python3 -m pytest -q tests/test_fastpath.py -p no:cacheprovider --tb=short > $OUT/pytest_fastpath.log 2>&1; tail -n 2 $OUT/pytest_fastpath.log
step 150 python3 -m ditfuse bench --op attention --shapes same-l-8704,same-l-trt,same-l-8704-plain,same-l-32946 --dtypes fp32 --extra-dtypes "" --impls ditfuse,ditfuse-graph,copy --out-dir $OUT/bench_attn32 > $OUT/bench_attn32.log 2>&1; grep -E "ditfuse" $OUT/bench_attn32.log | tail -8
rm -f $OUT/*/*.png
echo "seconds used by the steps: $(( SECONDS - T0 ))"
