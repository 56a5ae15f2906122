#!/usr/bin/env bash
# Session 6's last call: the whole test suite on the H200 (final code). Carry .whl.
source benchmarks/device_env.sh
BUDGET=420 step 400 python3 -m pytest tests -p no:cacheprovider -q --tb=short -rs -x > $OUT/pytest_gpu_all.log 2>&1; tail -6 $OUT/pytest_gpu_all.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
