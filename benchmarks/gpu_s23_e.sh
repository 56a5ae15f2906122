#!/usr/bin/env bash
# Session 23, call e: GELU (tanh) with libdevice's tanhf written branch-free (activations._tanhf):
# the activation tests on the H200 (every bf16 / fp16 input and 2^22 fp32 values bitwise
# PyTorch's F.gelu), the activation bench rows (FLUX.1 GELU, FLUX.2 SwiGLU: unchanged kernel).
source benchmarks/device_env.sh
BUDGET=300
step 120 python3 -m pytest tests/test_activations.py -p no:cacheprovider -q --tb=short > $OUT/pytest_act.log 2>&1; tail -n 4 $OUT/pytest_act.log
step 150 python3 -m ditfuse bench --op activations --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench_act > $OUT/bench_act.log 2>&1; grep -E "gelu|swiglu" $OUT/bench_act.log | tail -14
rm -f $OUT/*/*.png
echo "seconds used by the steps: $(( SECONDS - T0 ))"
