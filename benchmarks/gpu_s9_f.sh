#!/usr/bin/env bash
# Session 9, sixth call: GroupNorm's split path with the apply launch dependent on the
# statistics launch (PDL: the apply programs load x while the statistics finish) against
# the same tree without it (PDL=0), alternating twice; the GroupNorm GPU tests and parity
# gates with it on; the GroupNorm bench rows.
source benchmarks/device_env.sh
BUDGET=560
S="flux-vae-mid-128 flux-vae-up1-256 flux-vae-up2-512 flux-vae-out-1024 hunyuan-vae-mid hunyuan-vae-up-9f"
for i in 1 2; do
  PDL=0 step 40 python3 benchmarks/gn_times.py nopdl $S >> $OUT/gn_pdl.log 2>&1
  PDL=1 step 40 python3 benchmarks/gn_times.py pdl $S >> $OUT/gn_pdl.log 2>&1
done
cat $OUT/gn_pdl.log
step 150 python3 -m pytest tests/test_group_norm.py -p no:cacheprovider -q --tb=short -x > $OUT/pytest_gn.log 2>&1
tail -3 $OUT/pytest_gn.log
step 60 python3 benchmarks/gn_gates.py > $OUT/gn_gates.log 2>&1
tail -4 $OUT/gn_gates.log
step 150 python3 -m ditfuse bench --op group_norm --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench > $OUT/bench_gn.log 2>&1
grep -vE "^\[|^$" $OUT/bench_gn.log | tail -16
echo "seconds used by the steps: $(( SECONDS - T0 ))"
