#!/usr/bin/env bash
# Session 10, seventh call: `ditfuse check` again at production shapes (RoPE outputs judged
# within a rounding of their rotary pair's magnitude; rotate-half with norms across heads on
# the per-token kernel), and the TMA / check tests on the GPU.
source benchmarks/device_env.sh
BUDGET=300
step 200 python3 -m ditfuse check --out $OUT/check_table.txt > $OUT/check.log 2>&1
echo "check: $(grep -c '| PASS' $OUT/check_table.txt) PASS, $(grep -c '| FAIL' $OUT/check_table.txt) FAIL"
grep "| FAIL" $OUT/check_table.txt
grep "hunyuan\|shared==" $OUT/check_table.txt | cut -c1-180
step 80 python3 -m pytest tests/test_qk_tma.py tests/test_check_qk.py -p no:cacheprovider -q --tb=short > $OUT/pytest.log 2>&1
tail -2 $OUT/pytest.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
