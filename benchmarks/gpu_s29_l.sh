#!/usr/bin/env bash
# Session 29, call l: after the review refactor (one descriptor helper, one epilogue, one grid
# helper; sm_90 SASS unchanged on the CPU): the Gluon tests and the replay tests on the H200.
source benchmarks/device_env.sh
BUDGET=200
step 100 python3 -m pytest -q tests/test_attention_gluon.py -p no:cacheprovider --tb=short > $OUT/pytest_attention_gluon.log 2>&1; tail -n 2 $OUT/pytest_attention_gluon.log
step 60 python3 -m pytest -q tests/test_fastpath.py -p no:cacheprovider --tb=short > $OUT/pytest_fastpath.log 2>&1; tail -n 2 $OUT/pytest_fastpath.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
