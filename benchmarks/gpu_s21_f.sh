#!/usr/bin/env bash
# Session 21, sixth call: the channel RMS with several position blocks a program and the
# next block's loads pipelined (rms_pipe.py), at wan-vae-out-480p bf16.
source benchmarks/device_env.sh
BUDGET=330
step 300 python3 benchmarks/rms_pipe.py > $OUT/rms_pipe.log 2>&1; cat $OUT/rms_pipe.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
