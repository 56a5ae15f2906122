#!/usr/bin/env bash
# The committed GPU run (one device call): benchmark CSV + chart of every op, the GPU-only
# tests (AOT packages loaded by the Triton-free loader, launch cache), the parity gates at
# production shapes. Carry .whl (diffusers, liger-kernel, importlib_metadata wheels; see the
# device README) and copy $OUT into benchmarks/results and benchmarks/logs.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:src || exit 1
export PYTHONUNBUFFERED=1
timeout ${BENCH_S:-330} python3 -m ditfuse bench --out-dir $OUT ${BENCH_ARGS:-} 2>&1 | tee $OUT/bench.log | grep -v "^\[" 
timeout 150 python3 -m pytest tests/test_aot.py tests/test_launch_cache.py tests/test_patch_cuda_graph.py -q -p no:cacheprovider -rs 2>&1 | tail -25 | tee $OUT/pytest_gpu.log
timeout 120 python3 -m ditfuse check --out $OUT/check_table.txt > $OUT/check.log 2>&1; tail -3 $OUT/check.log
