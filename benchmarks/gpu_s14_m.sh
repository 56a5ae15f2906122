#!/usr/bin/env bash
# Session 14: Wan 1.3B on the channel form as before the session (no table-column mask).
source benchmarks/device_env.sh
BUDGET=100
cd benchmarks
step 60 python3 tree_times.py s14 qk:wan1.3b-480p,wan14b-480p 2>&1 | grep -v Warn | tee $OUT/tree_times2.log
