#!/usr/bin/env bash
# Session 15 h: word form x shared rows read once (ROW_BROADCAST) at the
# per-head registry shapes, bits compared; warps for the word form; its GPU tests.
source benchmarks/device_env.sh
BUDGET=300
step 150 python3 benchmarks/token_words_ab.py flux1-1024 flux2-1024 qwen-image-1328 hunyuan-video-544p sa3-dit same-l-decoder --warps 4 2>&1 | grep -v Warn | tee $OUT/token_words_ab.log
step 100 python3 -m pytest tests/test_qk_token_words.py -p no:cacheprovider -q --tb=short > $OUT/pytest_words.log 2>&1; tail -3 $OUT/pytest_words.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
