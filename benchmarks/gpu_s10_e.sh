#!/usr/bin/env bash
# Session 10, fifth call: HunyuanVideo's registry row as diffusers 0.42 and the patched
# processor run it ((B, S, H, D), in place; it was (B, H, S, D) out of place), then the whole
# QK-norm + RoPE and fast-path test files on the GPU (the last call's run was cut by its budget).
source benchmarks/device_env.sh
BUDGET=420
step 80 python3 -m ditfuse bench --op qk_norm_rope --shapes hunyuan-video-544p --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench > $OUT/bench_qk.log 2>&1
grep -E "ditfuse-graph|copy|compile" $OUT/bench_qk.log | tail -6
step 320 python3 -m pytest tests/test_qk_norm_rope.py tests/test_fastpath.py tests/test_table_once.py -p no:cacheprovider -q --tb=short > $OUT/pytest_qk.log 2>&1
tail -3 $OUT/pytest_qk.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
