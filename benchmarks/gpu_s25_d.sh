#!/usr/bin/env bash
# Session 25, call d (last): the running max from -FLT_MAX and the head count as a constant
# (the same bits as call c's kernel) -- the A/B against calls b-c's kernel and session 24's,
# then the GPU attention tests and the AOT package's GPU tests with the working tree's
# kernel (no bench rows, the A/B at the targets' three cases: the device time left after four
# refused starts does not cover more).
source benchmarks/device_env.sh
BUDGET=250
step 60 python3 benchmarks/attn_epilogue_ab.py --rounds 2 --quick > $OUT/attn_epilogue_ab.log 2>&1; grep -v "max|d|" $OUT/attn_epilogue_ab.log | tail -22; grep -c "bitwise epi's: False" $OUT/attn_epilogue_ab.log
step 110 python3 -m pytest -q tests/test_attention.py -p no:cacheprovider --tb=short > $OUT/pytest_attention.log 2>&1; tail -n 2 $OUT/pytest_attention.log
step 80 python3 -m pytest -q tests/test_aot.py -k "gpu or attention" -p no:cacheprovider --tb=short > $OUT/pytest_aot_gpu.log 2>&1; tail -n 2 $OUT/pytest_aot_gpu.log
rm -f $OUT/*/*.png
echo "seconds used by the steps: $(( SECONDS - T0 ))"
