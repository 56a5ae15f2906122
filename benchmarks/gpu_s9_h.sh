#!/usr/bin/env bash
# Session 9, eighth call: GroupNorm with PDL, the apply kernel waiting before any load (the
# seventh call found x loaded ahead of the wait cost 6%: 95 registers instead of 56), A/B
# against this session's first commit (ab/src) and PDL off, alternating twice; then the
# GroupNorm GPU tests and the bench rows.
source benchmarks/device_env.sh
BUDGET=400
S="flux-vae-mid-128 flux-vae-up1-256 flux-vae-up2-512 flux-vae-out-1024 hunyuan-vae-mid hunyuan-vae-up-9f"
for i in 1 2; do
  PYTHONPATH=/tmp/site:$PWD/ab/src step 40 python3 benchmarks/gn_times.py s8 $S >> $OUT/gn_ab.log 2>&1
  PDL=0 step 40 python3 benchmarks/gn_times.py nopdl $S >> $OUT/gn_ab.log 2>&1
  PDL=1 step 40 python3 benchmarks/gn_times.py pdl $S >> $OUT/gn_ab.log 2>&1
done
sort -k2,2 -s $OUT/gn_ab.log
step 100 python3 -m pytest tests/test_group_norm.py -p no:cacheprovider -q --tb=short -x > $OUT/pytest_gn.log 2>&1
tail -2 $OUT/pytest_gn.log
step 120 python3 -m ditfuse bench --op group_norm --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench > $OUT/bench_gn.log 2>&1
grep -E "ditfuse-graph" $OUT/bench_gn.log | tail -8
echo "seconds used by the steps: $(( SECONDS - T0 ))"
