#!/usr/bin/env bash
# Session 7, second call: the channel RMS with every load ahead of the sum (the branch's first
# run had the second piece's load behind the first piece's sum: 321 vs main's 282 us at
# wan-vae-out-480p) and one cross-warp sum; A/B against main's tree (ab/src, untracked copy),
# tile variants; then GroupNorm tests + gates on CUDA and the group_norm bench rows.
source benchmarks/device_env.sh
for i in 1 2; do
  PYTHONPATH=/tmp/site:$PWD/ab/src BUDGET=200 step 60 python3 benchmarks/gn_times.py main >> $OUT/times.log 2>&1
  BUDGET=200 step 60 python3 benchmarks/gn_times.py branch >> $OUT/times.log 2>&1
done
for t in 4096 16384; do
  RMS_TILE=$t BUDGET=250 step 40 python3 benchmarks/gn_times.py tile$t wan-vae-out-480p wan-vae-mid-480p >> $OUT/times.log 2>&1
done
grep " us" $OUT/times.log
BUDGET=300 step 40 python3 benchmarks/gn_gates.py > $OUT/check_gn.log 2>&1
grep -c PASS $OUT/check_gn.log; grep -E "FAIL|Error" $OUT/check_gn.log | head
BUDGET=400 step 100 python3 -m pytest tests/test_group_norm.py tests/test_fastpath.py -p no:cacheprovider -q -x --tb=short \
  > $OUT/pytest_gn.log 2>&1; tail -2 $OUT/pytest_gn.log
BUDGET=560 step 150 python3 -m ditfuse bench --op group_norm --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench_gn > $OUT/bench_gn.log 2>&1; grep -E "ditfuse-graph|compile" $OUT/bench_gn.log | head -20
echo "seconds used by the steps: $(( SECONDS - T0 ))"
