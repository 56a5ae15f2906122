#!/usr/bin/env bash
# Session 15 j: Wan in fp32 -- half-width vs full-width tables on the flat kernel's channel
# form (14B 480p fp32 719.9 us on half tables in i, 697.5 on full ones before); the flat
# kernel's GPU tests (cut by the budget in i).
source benchmarks/device_env.sh
BUDGET=260
step 80 python3 benchmarks/flat_sweep.py wan14b-480p wan1.3b-480p --dtype fp32 2>&1 | grep -v Warn | tee $OUT/flat_sweep_fp32.log
step 170 python3 -m pytest tests/test_qk_flat.py -p no:cacheprovider -q --tb=short -x > $OUT/pytest_flat.log 2>&1; tail -3 $OUT/pytest_flat.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
