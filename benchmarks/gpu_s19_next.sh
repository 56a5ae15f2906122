#!/usr/bin/env bash
# Prepared in session 18 (not run: the session's device time was spent).
# (1) The AOT package's CUDA-graph replay and launch-time parity on the H200 with the query
#     step (session 18's calls e and f ran out of time in the package fixture).
# (2) Attention tiles on mma.sync with 64 query rows on 4 warps (the mma_sync launch setting:
#     FlashAttention-2's warps [4, 1] layout, K / V tiles shared by the 4 warps), fp32 and
#     bf16, against the shipped table; a winner goes into launch_settings as it is.
source benchmarks/device_env.sh
BUDGET=570
step 200 python3 -m pytest tests/test_aot.py -k "gpu" -p no:cacheprovider -q --tb=short > $OUT/pytest_aot_gpu.log 2>&1; tail -n 3 $OUT/pytest_aot_gpu.log
step 130 python3 benchmarks/sweep_attention.py --s19b --cases=same-l-8704:fp32,same-l-trt:fp32,same-l-32946:fp32,same-l-8704-plain:fp32 > $OUT/sweep_mma2_fp32.log 2>&1; grep -E "us|BEST" $OUT/sweep_mma2_fp32.log
step 130 python3 benchmarks/sweep_attention.py --s19b --cases=same-l-8704:bf16,same-l-32946:bf16,same-l-trt:bf16 > $OUT/sweep_mma2_bf16.log 2>&1; grep -E "us|BEST" $OUT/sweep_mma2_bf16.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
