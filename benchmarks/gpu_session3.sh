#!/usr/bin/env bash
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 400 python3 benchmarks/sweep_qk.py 2>&1 | tee $OUT/sweep.log
