#!/usr/bin/env bash
# Prepared in session 19 (not run: the earlier try at this session's work had spent its device
# time, 161 s left): the pair-form tests with exact-statistics rows on the H200 (the CI fix),
# then what session 18 prepared (gpu_s19_next.sh): the AOT package's CUDA-graph replay and
# launch-time parity with the query step, and 64-row mma.sync attention tiles against the table.
source benchmarks/device_env.sh
BUDGET=575
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt
step 60 python3 -m pytest tests/test_qk_flat.py -k "pair_form" -p no:cacheprovider -q --tb=short > $OUT/pytest_pair_form.log 2>&1; tail -n 2 $OUT/pytest_pair_form.log
step 130 python3 benchmarks/sweep_attention.py --s19b --cases=same-l-8704:fp32,same-l-trt:fp32,same-l-32946:fp32,same-l-8704-plain:fp32 > $OUT/sweep_mma2_fp32.log 2>&1; grep -E "us|BEST" $OUT/sweep_mma2_fp32.log
step 130 python3 benchmarks/sweep_attention.py --s19b --cases=same-l-8704:bf16,same-l-32946:bf16,same-l-trt:bf16 > $OUT/sweep_mma2_bf16.log 2>&1; grep -E "us|BEST" $OUT/sweep_mma2_bf16.log
step 220 python3 -m pytest tests/test_aot.py -k "gpu" -p no:cacheprovider -q --tb=short > $OUT/pytest_aot_gpu.log 2>&1; tail -n 3 $OUT/pytest_aot_gpu.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
