#!/usr/bin/env bash
# Session 17, call j: SAME's prologue apart in one qk_norm_rope pass against two
# (benchmarks/attn_joint_ab.py), and the attention tests of the new path on the H200.
source benchmarks/device_env.sh
BUDGET=190
step 90 python3 benchmarks/attn_joint_ab.py --rounds=2 > $OUT/attn_joint_ab.log 2>&1; cat $OUT/attn_joint_ab.log
step 80 python3 -m pytest tests/test_attention.py -k "one_pass or replay_keeps or prologue or packed" -p no:cacheprovider -q --tb=short > $OUT/pytest_joint.log 2>&1; tail -n 3 $OUT/pytest_joint.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
