#!/usr/bin/env bash
# Session 15 step a (prepared in session 14): Wan's pair form with half-width tables (the ditfuse-half
# row) and the fused-form rows again (wan_pattern.py's fused run was broken in s14 i / j);
# the pair-form prototype for per-head norms against ditfuse's per-token kernel.
source benchmarks/device_env.sh
BUDGET=300
cd benchmarks
step 60 python3 wan_pattern.py wan14b-480p wan14b-720p --separate 2>&1 | grep -v Warn | tee $OUT/wan_pattern_sep.log
step 60 python3 wan_pattern.py wan14b-480p 2>&1 | grep -v Warn | tee $OUT/wan_pattern_fused.log
step 90 python3 flux_ladder.py flux1-1024 flux2-1024 qwen-image-1328 hunyuan-video-544p 2>&1 | grep -v Warn | tee $OUT/flux_ladder.log
step 60 python3 flux_ladder.py flux1-1024 flux2-1024 --warps 8 2>&1 | grep -v Warn | tee -a $OUT/flux_ladder.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
