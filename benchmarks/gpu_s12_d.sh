#!/usr/bin/env bash
# Session 12, fourth call: the head_dim-128 differential entry (4 warps) on the H200 -- every
# attention test and 150 randomized cases, what head dims 64 / 80 / 96 / 128 take now; then
# the norms' randomized cases and the patched models under CUDA graphs (cut by their step's
# time in the first call, logs/s12/a).
source benchmarks/device_env.sh
BUDGET=570
step 40 python3 benchmarks/attn_padded_times.py 2>&1 | grep -v Warn | tee $OUT/attn_padded.log
step 120 python3 -m pytest tests/test_attention.py -p no:cacheprovider -q -x --tb=short > $OUT/pytest_attn.log 2>&1; tail -2 $OUT/pytest_attn.log
DITFUSE_FUZZ_N=150 step 120 python3 -m pytest tests/test_attention_fuzz.py -p no:cacheprovider -q -x --tb=short > $OUT/pytest_attn_fuzz.log 2>&1; tail -2 $OUT/pytest_attn_fuzz.log
DITFUSE_FUZZ_N=100 step 250 python3 -m pytest tests/test_patch_cuda_graph.py tests/test_norms_fuzz.py -p no:cacheprovider -q -x --tb=short > $OUT/pytest_norms_fuzz.log 2>&1; tail -2 $OUT/pytest_norms_fuzz.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
