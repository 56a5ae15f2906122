#!/usr/bin/env bash
# Session 20, third call: Wan-Animate-2's QK-norm + RoPE at the 14B denoising shape (eager
# processor code vs the patched call, every element compared), then the 300 randomized
# attention cases that the second call's 200 s step cut at 243 (all passing).
source benchmarks/device_env.sh
BUDGET=500
step 160 python3 benchmarks/wan_animate2_qk.py > $OUT/wan_animate2_qk.log 2>&1; cat $OUT/wan_animate2_qk.log
DITFUSE_FUZZ_N=300 step 330 python3 -m pytest tests/test_attention_fuzz.py -p no:cacheprovider -q --tb=short > $OUT/pytest_attn_fuzz.log 2>&1; tail -n 3 $OUT/pytest_attn_fuzz.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
