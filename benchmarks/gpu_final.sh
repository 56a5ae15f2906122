#!/usr/bin/env bash
# The committed GPU run: benchmark CSV + chart, parity gates at production shapes, tests.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:src || exit 1
export PYTHONUNBUFFERED=1
timeout 330 python3 -m ditfuse bench --out-dir $OUT 2>&1 | tee $OUT/bench.log
timeout 60 python3 -m ditfuse check --out $OUT/check_table.txt > $OUT/check.log 2>&1; tail -1 $OUT/check.log
timeout 150 python3 -m pytest tests -q -p no:cacheprovider -x 2>&1 | tail -5 | tee $OUT/pytest_gpu.log
