#!/usr/bin/env bash
# Session 29, call f: the AOT package's GPU tests (its parity now against the Triton kernel it
# holds), and the fp32 entry's time split: no copies at all (the math and the stores alone).
source benchmarks/device_env.sh
BUDGET=400
step 90 python3 benchmarks/attn_gluon_fp32_s29.py --rounds 3 --variants kernel,diag_nocopy,diag_mem,diag_math > $OUT/attn_gluon_fp32_s29.log 2>&1; tail -3 $OUT/attn_gluon_fp32_s29.log
step 280 python3 -m pytest -q tests/test_aot.py -k gpu -p no:cacheprovider --tb=short -rA > $OUT/pytest_aot_gpu.log 2>&1; tail -n 4 $OUT/pytest_aot_gpu.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
