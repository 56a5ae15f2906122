#!/usr/bin/env bash
# Session 10, last call: the SA3 and SAME-L QK rows as the models call them (q1 / k1 chunks of
# the packed [q1|q2|k1|k2|v] projection; SA3 in place, SAME into scratch).
source benchmarks/device_env.sh
BUDGET=200
step 180 python3 -m ditfuse bench --op qk_norm_rope --shapes sa3-dit,same-l-decoder --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench > $OUT/bench_qk.log 2>&1
grep -E "copy|compile|ditfuse" $OUT/bench_qk.log | tail -10
echo "seconds used by the steps: $(( SECONDS - T0 ))"
