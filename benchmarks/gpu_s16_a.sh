#!/usr/bin/env bash
# Prepared in session 15 (not run; the session's device time ran out): the Wan fp32 bench rows
# with flat_settings' 1-warp fp32 entry (the sweep in logs/s15/j: 659.2 us at 14B 480p), the
# per-token word-form tests and the QK fuzz on the GPU after the final review.
source benchmarks/device_env.sh
BUDGET=560
step 150 python3 -m ditfuse bench --op qk_norm_rope --shapes wan14b-480p,wan1.3b-480p,wan5b-ti2v-704p --dtypes fp32 --extra-dtypes "" --out-dir $OUT/bench_qk32 > $OUT/bench_qk32.log 2>&1; grep -E "ditfuse-graph" $OUT/bench_qk32.log | tail -3
step 200 python3 -m pytest tests/test_qk_token_words.py tests/test_qk_fuzz.py tests/test_qk_norm_rope.py -p no:cacheprovider -q --tb=short -x > $OUT/pytest_qk.log 2>&1; tail -3 $OUT/pytest_qk.log
# issue 5: small query tiles on mma.sync (half the scores a query at window 17; see --s16)
step 150 python3 benchmarks/sweep_attention.py --s16 2>&1 | grep -v Warn | tee $OUT/sweep_attention_s16.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
