#!/usr/bin/env bash
# Session 6: sliding_window_attention launch settings not swept before (16-key tiles,
# 32-query tiles; sweep_attention.py --s6) at the SAME-L shapes. Carry .whl.
source benchmarks/device_env.sh
step 240 python3 benchmarks/sweep_attention.py --s6 > $OUT/sweep_attention_s6.log 2>&1; grep -v Warn $OUT/sweep_attention_s6.log | grep -E "us|BEST" | head -40
echo "seconds used by the steps: $(( SECONDS - T0 ))"
