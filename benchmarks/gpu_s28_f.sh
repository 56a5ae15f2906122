#!/usr/bin/env bash
# Session 28, call f: the library's TMA-fed Gluon kernel -- A/B against the session's
# earlier forms, its bitwise GPU tests, the replay tests (TMA descriptors rebuilt at replay),
# the attention tests, randomized cases and the AOT package's GPU tests.
source benchmarks/device_env.sh
BUDGET=420
step 90 python3 benchmarks/attn_gluon_s28_ab.py --rounds 3 --variants s27,wait0,library,tma3_128 > $OUT/attn_gluon_s28_ab.log 2>&1; cat $OUT/attn_gluon_s28_ab.log | tail -6
step 60 python3 -m pytest -q tests/test_attention_gluon.py -p no:cacheprovider --tb=short > $OUT/pytest_attention_gluon.log 2>&1; tail -n 2 $OUT/pytest_attention_gluon.log
step 60 python3 -m pytest -q tests/test_fastpath.py -p no:cacheprovider --tb=short > $OUT/pytest_fastpath.log 2>&1; tail -n 2 $OUT/pytest_fastpath.log
step 140 python3 -m pytest -q tests/test_attention.py -p no:cacheprovider --tb=short -x > $OUT/pytest_attention.log 2>&1; tail -n 2 $OUT/pytest_attention.log
DITFUSE_FUZZ_N=60 step 60 python3 -m pytest -q tests/test_attention_fuzz.py -p no:cacheprovider --tb=short > $OUT/pytest_attn_fuzz.log 2>&1; tail -n 2 $OUT/pytest_attn_fuzz.log
step 60 python3 -m pytest -q tests/test_aot.py -k "gpu or attention" -p no:cacheprovider --tb=short > $OUT/pytest_aot_gpu.log 2>&1; tail -n 2 $OUT/pytest_aot_gpu.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
