#!/usr/bin/env bash
# Session 28, call d: the library's Gluon kernel with row pointers computed once, against the
# session's first fix (wait0), the s27 kernel and the TMA-fed prototypes
# (benchmarks/attn_gluon_s28_ab.py); the library's GPU tests; FlexAttention's ratio.
source benchmarks/device_env.sh
BUDGET=500
step 240 python3 benchmarks/attn_gluon_s28_ab.py --rounds 5 --variants s27,wait0,library,tma,tma_3st_128 > $OUT/attn_gluon_s28_ab.log 2>&1; cat $OUT/attn_gluon_s28_ab.log | tail -6
step 120 python3 -m pytest -q tests/test_attention_gluon.py -p no:cacheprovider --tb=short > $OUT/pytest_attention_gluon.log 2>&1; tail -n 3 $OUT/pytest_attention_gluon.log
step 120 python3 benchmarks/flex_ratio.py --rounds 3 --cases same-l-8704-bfloat16 > $OUT/flex_ratio.log 2>&1; tail -3 $OUT/flex_ratio.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
