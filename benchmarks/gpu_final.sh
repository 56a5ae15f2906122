#!/usr/bin/env bash
# The last device call of a session with little device time left: every step bounded by
# what remains of BUDGET seconds, in order of what the open issues need. Carry .whl; copy
# $OUT into benchmarks/results and benchmarks/logs.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD/src || exit 1
export PYTHONUNBUFFERED=1
T0=$SECONDS
step() {  # step SECONDS CMD...: run CMD for at most SECONDS, less if the budget is nearly spent
  local t=$1 l=$(( ${BUDGET:-575} - (SECONDS - T0) )); shift
  if (( l < 15 )); then echo "skipped (budget): $*"; return; fi
  (( t > l )) && t=$l
  timeout "$t" "$@"
}
step 140 python3 -m pytest tests/test_aot.py tests/test_group_norm.py tests/test_adaln.py tests/test_no_half_fma.py \
  -q -p no:cacheprovider --tb=short -rs -s -k "gpu or loader_binds or random_inputs or wan_rms or rows or settings or no_half" \
  > $OUT/pytest_gpu.log 2>&1; tail -3 $OUT/pytest_gpu.log
# the ops changed this session (AdaLN: rows per program; RMS norm: no contraction), merged
# into the session's first full bench (qk_norm_rope and attention unchanged since)
step 70 python3 -m ditfuse bench --op adaln --out-dir /tmp/a > $OUT/bench.log 2>&1
step 35 python3 -m ditfuse bench --op group_norm --out-dir /tmp/g >> $OUT/bench.log 2>&1
grep -E "ditfuse-graph|compile " $OUT/bench.log | grep -E "bf16" | head -40
python3 benchmarks/merge_results.py $OUT/NVIDIA-H200-$(date +%F).csv benchmarks/results/NVIDIA-H200-2026-11-29.csv /tmp/a/*.csv /tmp/g/*.csv
step 200 python3 -m ditfuse bench --e2e ${E2E_ARGS:---models same-l,flux1-1024,flux2-1024 --layers 2} --out-dir $OUT > $OUT/e2e.log 2>&1; grep -v Warn $OUT/e2e.log | tail -32
step 75 python3 -m ditfuse check --out $OUT/check_table.txt > /dev/null 2>&1; grep -c "| PASS" $OUT/check_table.txt; grep "| FAIL" $OUT/check_table.txt
step 110 python3 benchmarks/sweep_attention.py > $OUT/sweeps.log 2>&1
step 60 python3 benchmarks/sweep_adaln.py >> $OUT/sweeps.log 2>&1
grep BEST $OUT/sweeps.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
