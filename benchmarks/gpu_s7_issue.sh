#!/usr/bin/env bash
# Branch s6-fast-silu (written in session 6, not yet run: the session's device time was
# spent): GroupNorm / channel RMS with SiLU's exp2 and division as single ex2.approx.ftz /
# div.approx.ftz instructions, rstd * w folded per channel, and the channel-RMS column as
# two power-of-two pieces (96 = 64 + 32, no masked quarter), and (third commit) int32
# offsets inside a split-path tile and no masks on whole tiles: the passes are bound by
# instruction issue (sm_90 SASS, benchmarks/sass_count.py: GroupNorm apply 1144 -> 832
# instructions a program, 143 -> 104 us to issue at flux-vae-out-1024; statistics loop body
# 505 -> 353; channel RMS 1288 -> 840, 246 -> 160 us at wan-vae-out-480p, with the fourth
# commit: int32 offsets and no masks in its column block too). Times first (graph_us, as
# the bench's ditfuse-graph column; main's: logs/s6/gn3/bench_gn.log), then the GroupNorm
# tests and check gates on CUDA, then the bench rows. Carry .whl.
source benchmarks/device_env.sh
# A/B against main's tree (ab/src, an untracked copy carried with the working tree),
# alternating so drift shows up in the spread.
for i in 1 2; do
  PYTHONPATH=/tmp/site:$PWD/ab/src BUDGET=200 step 60 python3 benchmarks/gn_times.py main >> $OUT/silu_times.log 2>&1
  BUDGET=200 step 60 python3 benchmarks/gn_times.py branch >> $OUT/silu_times.log 2>&1
done
cat $OUT/silu_times.log | grep " us"
BUDGET=280 step 40 python3 benchmarks/gn_gates.py > $OUT/check_gn.log 2>&1
grep -c PASS $OUT/check_gn.log; grep -E "FAIL|Error" $OUT/check_gn.log | head
BUDGET=430 step 150 python3 -m pytest tests/test_group_norm.py tests/test_fastpath.py -p no:cacheprovider -q -x --tb=short \
  > $OUT/pytest_gn.log 2>&1; tail -2 $OUT/pytest_gn.log
BUDGET=580 step 150 python3 -m ditfuse bench --op group_norm --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench_gn > $OUT/bench_gn.log 2>&1; grep -E "ditfuse-graph|compile" $OUT/bench_gn.log | head -20
echo "seconds used by the steps: $(( SECONDS - T0 ))"
