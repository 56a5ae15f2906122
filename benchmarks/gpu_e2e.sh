#!/usr/bin/env bash
# The end-to-end device call (issue 7): whole transformers, unpatched/patched x eager/compile,
# 20-step trajectory PSNR. Carry .whl (diffusers); copy $OUT into benchmarks/results.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:src || exit 1
export PYTHONUNBUFFERED=1
timeout 560 python3 -m ditfuse bench --e2e --layers 2 --out-dir $OUT 2>&1 | tee $OUT/e2e.log
