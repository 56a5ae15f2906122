#!/usr/bin/env bash
# Session 29, call e: where the fp32 Gluon entry's time goes (the math with L2-hit copies, the
# copies without the math) and a persistent form (the next tile's copies under this tile's
# trips), against the library and the Triton entry.
source benchmarks/device_env.sh
BUDGET=240
step 220 python3 benchmarks/attn_gluon_fp32_s29.py --rounds 5 > $OUT/attn_gluon_fp32_s29.log 2>&1; tail -14 $OUT/attn_gluon_fp32_s29.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
