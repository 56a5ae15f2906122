#!/usr/bin/env bash
# Session 17, call f: the TMA-fed band attention experiment (benchmarks/attn_tma.py): tiles by
# host tensor descriptors, with and without Triton's Hopper warp specialization, against the
# shipped kernel at SAME-L 8704 / 32946 bf16 and the fp32 TensorRT contract / 8704 shapes.
source benchmarks/device_env.sh
BUDGET=200
step 190 python3 benchmarks/attn_tma.py > $OUT/attn_tma.log 2>&1; cat $OUT/attn_tma.log | grep -v "^ "
echo "seconds used by the steps: $(( SECONDS - T0 ))"
