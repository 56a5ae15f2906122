#!/usr/bin/env bash
# Session 11, fourth call: GroupNorm with the cache hints (src) -- parity gates on CUDA, the
# GroupNorm GPU tests, the bench rows; then the joint-attention models' QK as their
# processors call it (two calls, text and image) against one call over the joint sequence.
source benchmarks/device_env.sh
BUDGET=560
step 60 python3 benchmarks/qk_joint_times.py src 2>&1 | grep -v Warn | tee $OUT/qk_joint.log
step 30 python3 benchmarks/gn_gates.py > $OUT/check_gn.log 2>&1
grep -c PASS $OUT/check_gn.log; grep -E "FAIL|Error" $OUT/check_gn.log | head
step 90 python3 -m ditfuse bench --op group_norm --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench_gn > $OUT/bench_gn.log 2>&1; grep -E "ditfuse-graph" $OUT/bench_gn.log | head -8
step 200 python3 -m pytest tests/test_group_norm.py tests/test_gn_builds.py tests/test_fastpath.py -p no:cacheprovider -q --tb=short -rs > $OUT/pytest_gn.log 2>&1; tail -3 $OUT/pytest_gn.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
