#!/usr/bin/env bash
# The committed GPU run (one device call): benchmark CSV + chart of every op, the GPU-only
# tests (AOT packages loaded by the Triton-free loader, launch cache, patched models in CUDA
# graphs) and the kernels' GPU tests, the parity gates at production shapes. Carry .whl
# (diffusers, liger-kernel, importlib_metadata wheels; see the device README) and copy $OUT
# into benchmarks/results and benchmarks/logs.
source benchmarks/device_env.sh
timeout ${BENCH_S:-300} python3 -m ditfuse bench --out-dir $OUT ${BENCH_ARGS:-} > $OUT/bench.log 2>&1; grep -A200 "^summary" $OUT/bench.log | head -80
timeout 170 python3 -m pytest tests/test_aot.py tests/test_patch_cuda_graph.py \
  tests/test_group_norm.py tests/test_no_half_fma.py -q -p no:cacheprovider -rs --tb=short > $OUT/pytest_gpu.log 2>&1
tail -25 $OUT/pytest_gpu.log
timeout 100 python3 -m ditfuse check --out $OUT/check_table.txt > /dev/null 2>&1; grep -c "| PASS" $OUT/check_table.txt; grep "| FAIL" $OUT/check_table.txt
timeout 150 python3 benchmarks/sweep_adaln.py > $OUT/sweeps.log 2>&1
timeout 90 python3 benchmarks/sweep_gn.py >> $OUT/sweeps.log 2>&1; grep BEST $OUT/sweeps.log
