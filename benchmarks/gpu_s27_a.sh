#!/usr/bin/env bash
# Session 27, calls a, b: the Gluon prototype of the SAME-L bf16/fp16 differential entry
# (benchmarks/attn_gluon.py): its bits against the shipped kernel's on seven cases, then
# CUDA-graph times against the shipped kernel at four shapes, 3 rounds (a: 9 launch variants; b: stages 3-5, the next S1 issued mid-trip).
source benchmarks/device_env.sh
BUDGET=420
step 400 python3 benchmarks/attn_gluon.py > $OUT/attn_gluon.log 2>&1; tail -30 $OUT/attn_gluon.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
