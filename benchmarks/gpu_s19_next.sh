#!/usr/bin/env bash
# Prepared in session 18 (not run: the session's device time was spent): (1) the AOT package's
# CUDA-graph replay and launch-time parity on the H200 with the query step (session 18's calls
# e and f ran out of time in the package fixture); (2) the query step where the session did
# not measure it: head_dim 128 differential (attn_d128_sweep.py --step) and SAME's fused
# prologue entry (sweep_attention.py --s19 --prologue); (3) the rest of the randomized cases.
source benchmarks/device_env.sh
BUDGET=570
step 220 python3 -m pytest tests/test_aot.py -k "gpu" -p no:cacheprovider -q --tb=short > $OUT/pytest_aot_gpu.log 2>&1; tail -n 3 $OUT/pytest_aot_gpu.log
step 100 python3 benchmarks/attn_d128_sweep.py --step > $OUT/attn_d128_step.log 2>&1; cat $OUT/attn_d128_step.log
step 100 python3 benchmarks/sweep_attention.py --s19 --prologue --cases=same-l-8704:bf16,same-l-32946:bf16 > $OUT/sweep_prologue_step.log 2>&1; grep -E "us|BEST" $OUT/sweep_prologue_step.log
DITFUSE_FUZZ_N=300 step 140 python3 -m pytest tests/test_attention_fuzz.py -p no:cacheprovider -q --tb=short > $OUT/pytest_attn_fuzz.log 2>&1; tail -n 3 $OUT/pytest_attn_fuzz.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
