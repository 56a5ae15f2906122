#!/usr/bin/env bash
# Session 9, last call: the GPU tests of the final tree that earlier calls did not run with
# the new QK table (AOT packages and their launches, inspect, fast-path replays, flat QK).
source benchmarks/device_env.sh
BUDGET=240
step 230 python3 -m pytest tests/test_aot.py tests/test_inspect.py tests/test_fastpath.py tests/test_kernel_utils.py tests/test_qk_library.py -p no:cacheprovider -q --tb=short -x -rs > $OUT/pytest.log 2>&1
tail -6 $OUT/pytest.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
