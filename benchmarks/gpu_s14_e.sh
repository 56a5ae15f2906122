#!/usr/bin/env bash
# Session 14, fifth call: Wan QK on separate Q / K tensors (diffusers' default Wan: to_q /
# to_k, no fuse_projections) against the fused QKV rows, 480p and 720p.
source benchmarks/device_env.sh
BUDGET=200
cd benchmarks
step 60 python3 wan_pattern.py wan14b-480p wan14b-720p --separate 2>&1 | grep -v Warn | tee $OUT/wan_pattern_sep.log
step 60 python3 wan_pattern.py wan14b-720p 2>&1 | grep -v Warn | tee $OUT/wan_pattern_720p.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
