#!/usr/bin/env bash
# The committed GPU run: benchmark CSV + chart, parity gates at production shapes, tests.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:src || exit 1
export PYTHONUNBUFFERED=1
timeout 200 python3 -m ditfuse bench --out-dir $OUT 2>&1 | tee $OUT/bench.log
python3 benchmarks/overhead_qk.py 2>&1 | tee $OUT/overhead.log
timeout 150 python3 -m pytest tests -q -p no:cacheprovider -x 2>&1 | tail -5 | tee $OUT/pytest_gpu.log
