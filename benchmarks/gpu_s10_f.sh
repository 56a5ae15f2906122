#!/usr/bin/env bash
# Session 10, sixth call: `ditfuse check` at the registry's production shapes on the H200
# (the QK gates now call with the tables as the patched models pass them), then the patch
# tests (every covered model's tiny config, patched vs unpatched) on the GPU.
source benchmarks/device_env.sh
BUDGET=500
step 300 python3 -m ditfuse check --out $OUT/check_table.txt > $OUT/check.log 2>&1
echo "check: $(grep -c '| PASS' $OUT/check_table.txt) PASS, $(grep -c '| FAIL' $OUT/check_table.txt) FAIL"
grep "| FAIL" $OUT/check_table.txt
grep "qk accuracy" $OUT/check_table.txt | cut -c1-200
step 170 python3 -m pytest tests/test_patch.py tests/test_table_once.py tests/test_qk_norm_rope_diffusers.py -p no:cacheprovider -q --tb=short > $OUT/pytest_patch.log 2>&1
tail -3 $OUT/pytest_patch.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
