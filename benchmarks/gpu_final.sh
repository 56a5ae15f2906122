#!/usr/bin/env bash
# The last device call of a session with little device time left: every step bounded by
# what remains of BUDGET seconds, in order of what the open issues need. Session 3: patched
# models in CUDA graphs; e2e at 2 and 4 blocks (the difference is the per-block cost, free of
# the step's fixed prologue); the qk persistent-grid sweep; GroupNorm (split tile) and AdaLN
# (gated_residual rows) re-benchmarked and merged into BASE's CSV; attention if time is left.
# Carry .whl; copy $OUT into benchmarks/results and benchmarks/logs.
source benchmarks/device_env.sh
BASE=${BASE:-benchmarks/results/NVIDIA-H200-2026-11-29.csv}
M=${MODELS:-wan14b-480p,flux1-1024,flux2-1024}
step 40 python3 -m pytest tests/test_patch_cuda_graph.py -q -p no:cacheprovider --tb=short -rs > $OUT/pytest_cuda_graph.log 2>&1; tail -2 $OUT/pytest_cuda_graph.log
step 170 python3 -m ditfuse bench --e2e --models $M --layers 2 --out-dir $OUT/l2 2>&1 | grep -v Warn > $OUT/e2e_l2.log; grep -E "eager|compile" $OUT/e2e_l2.log
step 190 python3 -m ditfuse bench --e2e --models $M --layers 4 --out-dir $OUT/l4 2>&1 | grep -v Warn > $OUT/e2e_l4.log; grep -E "eager|compile" $OUT/e2e_l4.log
step 70 python3 benchmarks/sweep_qk.py ${QK_SWEEP:-wan14b-480p,flux1-1024,hunyuan-video-544p,sa3-dit,same-l-decoder} > $OUT/sweep_qk.log 2>&1; grep BEST $OUT/sweep_qk.log
NEW=()  # only the benches that finished are merged (a cut-off one would drop a case's rows)
bench() {  # bench SECONDS DIR ARGS...
  local t=$1 d=$2; shift 2
  step $t python3 -m ditfuse bench "$@" --out-dir $d >> $OUT/bench.log 2>&1 && NEW+=($d/*.csv)
}
bench 45 /tmp/b_gn --op group_norm --dtypes bf16 --extra-dtypes ""
bench 45 /tmp/b_ad --op adaln --shapes wan14b-480p,wan14b-720p,flux1-1024,flux2-1024 --dtypes bf16 --extra-dtypes ""
bench 70 /tmp/b_at --op attention --dtypes bf16 --extra-dtypes ""
grep -E "ditfuse-graph|compile |flex " $OUT/bench.log | head -60
(( ${#NEW[@]} )) && python3 benchmarks/merge_results.py $OUT/NVIDIA-H200-$(date +%F).csv $BASE "${NEW[@]}"
echo "seconds used by the steps: $(( SECONDS - T0 ))"
