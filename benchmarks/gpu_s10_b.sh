#!/usr/bin/env bash
# Session 10, second call: GroupNorm's apply pass in L2 order (the tiles the statistics
# programs read last first) against the natural order, alternating twice, plus the L2 order
# with fewer / more statistics programs; then the GroupNorm GPU tests and the bench rows.
source benchmarks/device_env.sh
BUDGET=420
S="flux-vae-mid-128 flux-vae-up1-256 flux-vae-up2-512 flux-vae-out-1024 hunyuan-vae-mid hunyuan-vae-up-9f"
for i in 1 2; do
  LAUNCH='{"l2_order": false}' step 40 python3 benchmarks/gn_times.py natural $S >> $OUT/gn_ab.log 2>&1
  step 40 python3 benchmarks/gn_times.py l2 $S >> $OUT/gn_ab.log 2>&1
done
LAUNCH='{"stats_programs": 512}' step 40 python3 benchmarks/gn_times.py l2-sp512 $S >> $OUT/gn_ab.log 2>&1
LAUNCH='{"stats_programs": 2048}' step 40 python3 benchmarks/gn_times.py l2-sp2k $S >> $OUT/gn_ab.log 2>&1
LAUNCH='{"stats_programs": 512, "l2_order": false}' step 40 python3 benchmarks/gn_times.py nat-sp512 $S >> $OUT/gn_ab.log 2>&1
sort -k2,2 -s $OUT/gn_ab.log
step 100 python3 -m pytest tests/test_group_norm.py -p no:cacheprovider -q --tb=short -x > $OUT/pytest_gn.log 2>&1
tail -2 $OUT/pytest_gn.log
step 120 python3 -m ditfuse bench --op group_norm --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench > $OUT/bench_gn.log 2>&1
grep -E "ditfuse-graph" $OUT/bench_gn.log | tail -8
echo "seconds used by the steps: $(( SECONDS - T0 ))"
