#!/usr/bin/env bash
# Session 14, third call: the L2 state before a timed call (benchmarks/flush_study.py):
# do_bench's zeroing flush (dirty L2) vs a read-only flush vs back-to-back calls, for a
# copy of the same bytes and the ditfuse call, at the shapes that miss their targets.
source benchmarks/device_env.sh
BUDGET=300
cd benchmarks
step 250 python3 flush_study.py qk:flux1-1024 qk:flux2-1024 qk:qwen-image-1328 qk:wan14b-480p adaln:flux1-1024 adaln:flux2-1024 gn:flux-vae-mid-128 gn:hunyuan-vae-mid 2>&1 | grep -v Warn | tee $OUT/flush_study.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
