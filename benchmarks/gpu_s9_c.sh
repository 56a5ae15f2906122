#!/usr/bin/env bash
# Session 9, third call: the bench rows that changed (qk_norm_rope at SAME-L and SA3: the
# cheaper tanh and 2 warps a token at head_dim 64 in 16-bit), SAME's own attention call
# (prologue apart: the QK pass got faster), Wan's QK in place vs out of place (calibration
# rows), and the GPU tests of what changed.
source benchmarks/device_env.sh
BUDGET=580
step 100 python3 -m ditfuse bench --op qk_norm_rope --shapes same-l-decoder,sa3-dit --dtypes bf16,fp16,fp32 --extra-dtypes "" --out-dir $OUT/bench > $OUT/bench_qk.log 2>&1
grep -vE "^\[|^$" $OUT/bench_qk.log | tail -22
step 70 python3 benchmarks/attn_prologue_ab.py > $OUT/attn_prologue_ab.log 2>&1
grep "public call" $OUT/attn_prologue_ab.log
step 80 python3 benchmarks/calib_qk.py wan14b-480p > $OUT/calib_qk.log 2>&1
grep -E "default|flat 2w|in place|copy" $OUT/calib_qk.log
step 200 python3 -m pytest tests/test_kernel_utils.py tests/test_qk_norm_rope.py tests/test_attention.py -p no:cacheprovider -q --tb=short -x > $OUT/pytest.log 2>&1
tail -4 $OUT/pytest.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
