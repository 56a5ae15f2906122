#!/usr/bin/env bash
# Session 11, first call: (1) the flat QK kernel with Q and K of a token in adjacent programs
# (grid (2 x tokens,): the K program reads the cos / sin row from L2, not DRAM again) against
# main's grid (tokens, 2), and with cache hints (v2: x loads evict_first, tables / weights
# evict_last; v3: + streaming stores), Wan 14B in place, then out of place; (2) GroupNorm with
# cache hints (g1: statistics loads evict_last, apply loads evict_first, streaming stores);
# (3) the GPU tests of the patched models under CUDA graphs and the flat kernel.
# Trees: ab/main (HEAD's src), src (new grid), ab/v2, ab/v3, ab/g1 (carry "ab").
source benchmarks/device_env.sh
BUDGET=575
tree() { case $1 in new) echo $PWD/src;; *) echo $PWD/ab/$1/src;; esac; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt
for r in 1 2; do
  for t in main new v2 v3; do
    step 60 env PYTHONPATH=/tmp/site:$(tree $t) python3 benchmarks/qk_ab.py $t --model-tables wan14b-480p wan14b-720p 2>&1 | grep -v Warn | tee -a $OUT/qk_ab.log
  done
done
for t in main new v3; do
  step 45 env PYTHONPATH=/tmp/site:$(tree $t) python3 benchmarks/qk_ab.py $t-oop --model-tables --out-of-place wan14b-480p 2>&1 | grep -v Warn | tee -a $OUT/qk_ab.log
done
for r in 1 2; do
  for t in main g1; do
    step 60 env PYTHONPATH=/tmp/site:$(tree $t) python3 benchmarks/gn_times.py $t flux-vae-out-1024 flux-vae-up2-512 flux-vae-up1-256 flux-vae-mid-128 hunyuan-vae-up-9f 2>&1 | grep -v Warn | tee -a $OUT/gn_ab.log
  done
done
step 170 python3 -m pytest tests/test_patch_cuda_graph.py tests/test_table_once.py tests/test_qk_flat.py -p no:cacheprovider -q --tb=short -rs > $OUT/pytest.log 2>&1
tail -3 $OUT/pytest.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
