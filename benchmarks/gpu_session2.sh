#!/usr/bin/env bash
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 120 python3 -m ditfuse check --out $OUT/check_table.txt 2>&1 | tail -3 | tee $OUT/check.log
timeout 400 python3 benchmarks/sweep_qk.py 2>&1 | tee $OUT/sweep.log
