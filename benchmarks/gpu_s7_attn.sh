#!/usr/bin/env bash
# Session 7: sliding-window attention with a register cap (ptxas .maxnreg) for more programs
# a SM, and fewer stages in fp32 (sweep_attention.py --s7), CUDA graphs.
source benchmarks/device_env.sh
BUDGET=400 step 380 python3 benchmarks/sweep_attention.py ${SWEEP:---s7} > $OUT/sweep_attention_s7.log 2>&1
grep -E "BEST|Error|us " $OUT/sweep_attention_s7.log | head -60
echo "seconds used by the steps: $(( SECONDS - T0 ))"
