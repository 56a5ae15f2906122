#!/usr/bin/env bash
# Prepared in session 11 for the next session (its device time was spent): (1) the randomized
# tests on the H200 with many cases, after the routing of the head_dim-128 differential
# prologue (session 11's run ended at attention case 52, logs/s11/g); (2) which launch
# settings the fused head_dim-128 differential prologue is right with (PROLOGUE_APART off for
# the repro, so that the fused kernel runs: benchmarks/repro_attn_fault.py --fused).
source benchmarks/device_env.sh
BUDGET=570
DITFUSE_FUZZ_N=300 step 300 python3 -m pytest tests/test_attention_fuzz.py -p no:cacheprovider -q -x --tb=short > $OUT/pytest_attn_fuzz.log 2>&1; tail -3 $OUT/pytest_attn_fuzz.log
DITFUSE_FUZZ_N=100 step 120 python3 -m pytest tests/test_norms_fuzz.py tests/test_patch_cuda_graph.py -p no:cacheprovider -q -x --tb=short > $OUT/pytest_norms_fuzz.log 2>&1; tail -3 $OUT/pytest_norms_fuzz.log
step 140 python3 benchmarks/repro_attn_fault.py --fused --settings 64,16,8,1 64,32,8,2 64,16,4,2 2>&1 | tee $OUT/repro.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
