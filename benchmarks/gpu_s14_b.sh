#!/usr/bin/env bash
# Session 14, second call: the resident path with the barrier polled by volatile loads and a
# back-off (was: atomics); where its time goes (gn_resident_diag.py); the GroupNorm tests.
source benchmarks/device_env.sh
BUDGET=300
cd benchmarks
step 60 python3 gn_resident_diag.py flux-vae-mid-128 hunyuan-vae-mid 2>&1 | grep -v Warn | tee $OUT/diag.log
for r in 1 2; do
  step 40 env LAUNCH='{"resident": 0}' python3 gn_times.py split flux-vae-mid-128 hunyuan-vae-mid 2>&1 | grep -v Warn | tee -a $OUT/gn_ab.log
  step 40 python3 gn_times.py res flux-vae-mid-128 hunyuan-vae-mid 2>&1 | grep -v Warn | tee -a $OUT/gn_ab.log
done
step 30 env LAUNCH='{"resident_tile": 8192}' python3 gn_times.py res8k flux-vae-mid-128 hunyuan-vae-mid 2>&1 | grep -v Warn | tee -a $OUT/gn_ab.log
cd ..
step 120 python3 -m pytest tests/test_group_norm.py -p no:cacheprovider -q --tb=short -x -k "resident or poison" > $OUT/pytest_gn.log 2>&1; tail -2 $OUT/pytest_gn.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
