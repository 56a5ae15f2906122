#!/usr/bin/env bash
# Session 11, last call: the randomized tests (QK, attention, GroupNorm / channel RMS / AdaLN)
# and the tests added this session, on the H200 (compiled kernels, not the interpreter);
# run with the default 40 / 24 cases (logs/s11/f), then DITFUSE_FUZZ_N=100 (logs/s11/g).
source benchmarks/device_env.sh
BUDGET=350
step 330 python3 -m pytest tests/test_qk_fuzz.py tests/test_attention_fuzz.py tests/test_norms_fuzz.py "tests/test_adaln.py::test_reference_and_fallback_read_2d_operands_per_batch" tests/test_qk_errors.py -p no:cacheprovider -q --tb=short -rs > $OUT/pytest_fuzz.log 2>&1; tail -5 $OUT/pytest_fuzz.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
