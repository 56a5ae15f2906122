#!/usr/bin/env bash
# Session 12, fifth call (the on-chip path was then removed: LOST; its diff is logs/s12/e/gn_onchip.diff): GroupNorm's on-chip path (the split path in one cooperative launch
# with a grid barrier, x re-read from L2; x <= 40 MB) on the H200: its tests (the barrier
# for real: the interpreter runs the two halves as two launches), then an A/B of CUDA-graph
# times against the two-launch split path (ab/main: the tree before it), alternating twice;
# flux-vae-up1-256 (67 MB) keeps the split path in both trees (control).
source benchmarks/device_env.sh
BUDGET=290
GN=gn:flux-vae-mid-128,hunyuan-vae-mid,hunyuan-vae-up-9f,flux-vae-up1-256
DITFUSE_FUZZ_N=30 step 100 python3 -m pytest tests/test_group_norm.py tests/test_norms_fuzz.py -p no:cacheprovider -q -x --tb=short -k "onchip or split_path or paths_agree or large_offset or silu_off or fuzz" > $OUT/pytest_gn.log 2>&1; tail -3 $OUT/pytest_gn.log
run() { local t=$1 d=$PWD/ab/$2/src; [ $2 = src ] && d=$PWD/src; step $t env PYTHONPATH=/tmp/site:$d python3 benchmarks/tree_times.py "${@:2}" 2>&1 | grep -v Warn | tee -a $OUT/tree_times.log; }
for r in 1 2; do run 40 main $GN; run 40 src $GN; done
echo "seconds used by the steps: $(( SECONDS - T0 ))"
