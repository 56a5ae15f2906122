#!/usr/bin/env bash
# Prepared in session 10 for the next session (its device time was spent): the patched
# models under CUDA graphs with session 10's processors (rotary tables made once per table,
# patching.table_once), then the Wan 14B end-to-end step at 4 blocks (its QK calls now take
# the full-table path: the e2e table's Wan row is session 5's).
source benchmarks/device_env.sh
BUDGET=560
step 120 python3 -m pytest tests/test_patch_cuda_graph.py tests/test_table_once.py -p no:cacheprovider -q --tb=short -rs > $OUT/pytest_graph.log 2>&1
tail -3 $OUT/pytest_graph.log
step 420 python3 -m ditfuse bench --e2e --models wan14b-480p --layers 4 --out-dir $OUT/l4 2>&1 | grep -v Warn > $OUT/e2e_l4.log; grep -E "eager|compile" $OUT/e2e_l4.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
