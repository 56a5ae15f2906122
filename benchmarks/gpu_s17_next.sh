#!/usr/bin/env bash
# Prepared in session 16 (not run: the session's device time was spent): the SAME-L decode
# end to end with session 16's fp32 attention entry (16-query one-warp tiles; the README's
# e2e table has 197.6 / 594.1 ms patched fp32 for 1 / 3 minutes from before it), and the
# attention tests the s16 calls cut, in full.
source benchmarks/device_env.sh
BUDGET=560
step 300 python3 -m ditfuse bench --e2e --models same-l --dtypes fp32,bf16 --out-dir $OUT/e2e_same > $OUT/e2e_same.log 2>&1; grep -E "same-l" $OUT/e2e_same.log | tail -12
DITFUSE_FUZZ_N=300 step 200 python3 -m pytest tests/test_attention_fuzz.py tests/test_qk_flat.py -p no:cacheprovider -q -x --tb=short > $OUT/pytest_attn_fuzz.log 2>&1; tail -n 2 $OUT/pytest_attn_fuzz.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
