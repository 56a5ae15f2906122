#!/usr/bin/env bash
# One device call: parity gates at production shapes, launch sweep, GPU test suite.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:src || exit 1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv | tee $OUT/gpu.txt
python3 -c "import torch,triton;print(torch.__version__, triton.__version__)" | tee -a $OUT/gpu.txt
timeout 180 python3 -m ditfuse check --out $OUT/check_table.txt 2>&1 | tee $OUT/check.log
timeout 200 python3 benchmarks/sweep_qk.py 2>&1 | tee $OUT/sweep.log
timeout 180 python3 -m pytest tests -x -q -p no:cacheprovider 2>&1 | tail -30 | tee $OUT/pytest_gpu.log
