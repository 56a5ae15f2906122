#!/usr/bin/env bash
# Session 12, second call: sliding_window_attention at head dims that are not a power of two
# (tiles padded to 128) -- the tests and 150 randomized cases (which now draw such head dims)
# on the H200, what the padding costs at SAME-L's shape; then the e2e rows of Qwen-Image.
source benchmarks/device_env.sh
BUDGET=570
step 60 python3 -m pytest tests/test_attention.py -p no:cacheprovider -q -x --tb=short -k "head_dims or padded or apart or bad_input" > $OUT/pytest_attn_padded.log 2>&1; tail -2 $OUT/pytest_attn_padded.log
DITFUSE_FUZZ_N=150 step 150 python3 -m pytest tests/test_attention_fuzz.py -p no:cacheprovider -q -x --tb=short > $OUT/pytest_attn_fuzz.log 2>&1; tail -2 $OUT/pytest_attn_fuzz.log
step 60 python3 benchmarks/attn_padded_times.py 2>&1 | grep -v Warn | tee $OUT/attn_padded.log
step 280 python3 -m ditfuse bench --e2e --models qwen-image-1328 --layers 4 --out-dir $OUT/l4 2>&1 | grep -v Warn > $OUT/e2e_qwen.log; grep -E "eager|compile|s$" $OUT/e2e_qwen.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
