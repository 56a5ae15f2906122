#!/usr/bin/env bash
# Session 28, call a: the Gluon entry's warp skip (attention.GLUON_WARP_SKIP) -- its GPU
# bitwise tests against the Triton kernel, the A/B (skip / no skip / Triton), and
# FlexAttention's ratio at SAME-L 8704 bf16 in the same run.
source benchmarks/device_env.sh
BUDGET=460
step 120 python3 -m pytest -q tests/test_attention_gluon.py -p no:cacheprovider --tb=short > $OUT/pytest_attention_gluon.log 2>&1; tail -n 3 $OUT/pytest_attention_gluon.log
step 170 python3 benchmarks/attn_warp_skip.py --rounds 5 > $OUT/attn_warp_skip.log 2>&1; cat $OUT/attn_warp_skip.log | tail -5
step 150 python3 benchmarks/flex_ratio.py --rounds 3 --cases same-l-8704-bfloat16 > $OUT/flex_ratio.log 2>&1; tail -4 $OUT/flex_ratio.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
