#!/usr/bin/env bash
# Session 5: is FLUX.1's patched eager step host-bound inside the e2e harness (two models,
# compiled graphs alive) although it is not alone (diag_eager)? e2e rows now carry each
# round's host time. Carry .whl.
source benchmarks/device_env.sh
step 90 python3 benchmarks/diag_eager.py flux1-1024 4 2>&1 | grep -v Warn > $OUT/diag_eager_flux1.log; tail -3 $OUT/diag_eager_flux1.log
step 230 python3 -m ditfuse bench --e2e --models ${MODELS:-flux1-1024,flux2-1024} --layers 4 --out-dir $OUT/l4 2>&1 | grep -v Warn > $OUT/e2e_l4.log; grep -E "eager|compile" $OUT/e2e_l4.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
