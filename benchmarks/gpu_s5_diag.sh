#!/usr/bin/env bash
# Session 5's third call: FLUX.1 patched + compile variants (host vs step). Carry .whl.
source benchmarks/device_env.sh
step 400 python3 benchmarks/diag_compile_variants.py flux1-1024 4 2>&1 | grep -v Warn > $OUT/diag_compile_variants.log; grep "ms a step" $OUT/diag_compile_variants.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
