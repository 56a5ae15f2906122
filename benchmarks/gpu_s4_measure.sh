#!/usr/bin/env bash
# Session 4's measuring call: GPU tests of what changed (TMA QK kernel, activations, AOT
# packages, patched models in CUDA graphs), the changed ops re-benchmarked and merged into
# BASE's CSV (activations, qk_norm_rope, attention), then where a patched FLUX step's time
# goes (eager, and FLUX.1 patched + compile). Every step bounded by what remains of BUDGET.
# Carry .whl; copy $OUT into benchmarks/results and benchmarks/logs.
source benchmarks/device_env.sh
BASE=${BASE:-benchmarks/results/NVIDIA-H200-2026-11-29.csv}
step 110 python3 -m pytest tests/test_qk_tma.py tests/test_activations.py -p no:cacheprovider \
  --tb=short -rs -q -k "not tma_equals or bshd" > $OUT/pytest_gpu_new.log 2>&1; tail -12 $OUT/pytest_gpu_new.log
step 150 python3 -m pytest tests/test_aot.py tests/test_patch_cuda_graph.py tests/test_no_half_fma.py \
  -p no:cacheprovider --tb=short -rs -q -k "gpu or cuda_graph or half" > $OUT/pytest_gpu.log 2>&1; tail -12 $OUT/pytest_gpu.log
NEW=()  # only the benches that finished are merged
bench() {  # bench SECONDS DIR ARGS...
  local t=$1 d=$2; shift 2
  step $t python3 -m ditfuse bench "$@" --out-dir $d >> $OUT/bench.log 2>&1 && NEW+=($d/*.csv)
}
bench 60 /tmp/b_act --op activations --dtypes bf16 --extra-dtypes ""
bench 110 /tmp/b_qk --op qk_norm_rope --dtypes bf16 --extra-dtypes fp32
bench 80 /tmp/b_at --op attention --dtypes bf16,fp32 --extra-dtypes ""
grep -E "ditfuse-graph|compile |flex " $OUT/bench.log | head -60
(( ${#NEW[@]} )) && python3 benchmarks/merge_results.py $OUT/NVIDIA-H200-$(date +%F).csv $BASE "${NEW[@]}"
step 110 python3 benchmarks/profile_e2e.py flux1-1024 4 compile > $OUT/profile_flux1.log 2>&1; grep -E "==" $OUT/profile_flux1.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
