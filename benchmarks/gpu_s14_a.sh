#!/usr/bin/env bash
# Session 14, first call: GroupNorm's resident path (x held in registers across a grid
# barrier, one cooperative launch) -- GPU tests (the real barrier, streams, graphs), sm_90
# builds, then an A/B against the split path at the shapes it takes (alternating twice),
# the resident tile at HunyuanVideo's mid block, and the GroupNorm bench rows.
source benchmarks/device_env.sh
BUDGET=560
step 200 python3 -m pytest tests/test_group_norm.py tests/test_fastpath.py -p no:cacheprovider -q --tb=short -rs -x > $OUT/pytest_gn.log 2>&1; tail -3 $OUT/pytest_gn.log
cd benchmarks
for r in 1 2; do
  step 40 env LAUNCH='{"resident": 0}' python3 gn_times.py split flux-vae-mid-128 hunyuan-vae-mid hunyuan-vae-up-9f 2>&1 | grep -v Warn | tee -a $OUT/gn_ab.log
  step 40 python3 gn_times.py res flux-vae-mid-128 hunyuan-vae-mid hunyuan-vae-up-9f 2>&1 | grep -v Warn | tee -a $OUT/gn_ab.log
done
step 30 env LAUNCH='{"resident_tile": 8192}' python3 gn_times.py res8k hunyuan-vae-mid 2>&1 | grep -v Warn | tee -a $OUT/gn_ab.log
step 30 env LAUNCH='{"resident_tile": 4096}' python3 gn_times.py res4k hunyuan-vae-mid 2>&1 | grep -v Warn | tee -a $OUT/gn_ab.log
cd ..
step 30 python3 benchmarks/gn_gates.py > $OUT/check_gn.log 2>&1
grep -c PASS $OUT/check_gn.log; grep -E "FAIL|Error" $OUT/check_gn.log | head
step 120 python3 -m ditfuse bench --op group_norm --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench_gn > $OUT/bench_gn.log 2>&1; grep -E "ditfuse-graph" $OUT/bench_gn.log | head -8
echo "seconds used by the steps: $(( SECONDS - T0 ))"
