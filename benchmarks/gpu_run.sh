#!/usr/bin/env bash
# The committed GPU run (one device call): benchmark CSV + chart of every op, parity gates
# at production shapes, the whole test suite on the GPU. Carry .whl (diffusers, liger-kernel,
# importlib_metadata wheels; see the device README) and copy $OUT into benchmarks/.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:src || exit 1
export PYTHONUNBUFFERED=1
timeout 300 python3 -m ditfuse bench --out-dir $OUT 2>&1 | tee $OUT/bench.log
timeout 120 python3 -m ditfuse check --out $OUT/check_table.txt > $OUT/check.log 2>&1; tail -1 $OUT/check.log
python3 benchmarks/overhead_qk.py 2>&1 | tee $OUT/overhead.log
timeout 150 python3 -m pytest tests -q -p no:cacheprovider -x 2>&1 | tail -5 | tee $OUT/pytest_gpu.log
