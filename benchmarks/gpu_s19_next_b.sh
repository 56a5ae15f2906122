#!/usr/bin/env bash
# Prepared in session 18: the query step where session 18 did not measure it -- head_dim 128
# differential (attn_d128_sweep.py --step) and SAME's fused prologue entry (sweep_attention.py
# --s19 --prologue; the table's row there runs the prologue apart) -- and 300 randomized cases.
source benchmarks/device_env.sh
BUDGET=570
step 100 python3 benchmarks/attn_d128_sweep.py --step > $OUT/attn_d128_step.log 2>&1; cat $OUT/attn_d128_step.log
step 100 python3 benchmarks/sweep_attention.py --s19 --prologue --cases=same-l-8704:bf16,same-l-32946:bf16 > $OUT/sweep_prologue_step.log 2>&1; grep -E "us|BEST" $OUT/sweep_prologue_step.log
DITFUSE_FUZZ_N=300 step 200 python3 -m pytest tests/test_attention_fuzz.py -p no:cacheprovider -q --tb=short > $OUT/pytest_attn_fuzz.log 2>&1; tail -n 3 $OUT/pytest_attn_fuzz.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
