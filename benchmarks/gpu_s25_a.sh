#!/usr/bin/env bash
# Session 25, call a: the attention kernel's epilogue (per-row reciprocals) and score order
# (both score products before either softmax), each alone and together, against the
# session-24 kernel; then the GPU attention tests with the working tree's kernel.
source benchmarks/device_env.sh
BUDGET=540
step 300 python3 benchmarks/attn_epilogue_ab.py --rounds 3 --settings > $OUT/attn_epilogue_ab.log 2>&1; cat $OUT/attn_epilogue_ab.log | grep -v "max|d|" | tail -60
grep "max|d|" $OUT/attn_epilogue_ab.log | awk '{print $1,$2,$3,$8,$11}' | head -40
step 220 python3 -m pytest -q -x tests/test_attention.py -p no:cacheprovider > $OUT/pytest_attention.log 2>&1; tail -3 $OUT/pytest_attention.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
