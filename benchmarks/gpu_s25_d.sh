#!/usr/bin/env bash
# Session 25, call d (last; ~5 minutes of device time left after four refused starts): with
# the shipped kernel (call c's: per-row reciprocals), the GPU tests call c's step limits cut
# -- the last 14 attention tests and the AOT package's GPU tests (driver launch bitwise the
# JIT call, graph replay, launch-time parity).
source benchmarks/device_env.sh
BUDGET=170
T="tests/test_attention.py::test_inference_only tests/test_attention.py::test_empty tests/test_attention.py::test_opcheck tests/test_attention.py::test_compile_fullgraph_matches_eager tests/test_attention.py::test_sm90_build_uses_tensor_cores_without_local_memory_in_loops tests/test_attention.py::test_sm90_build_mma_sync_option tests/test_attention.py::test_grid_order_does_not_change_bits tests/test_attention.py::test_d128_differential_prologue_runs_apart tests/test_attention.py::test_differential_prologue_apart_in_one_pass tests/test_attention.py::test_replay_keeps_the_one_pass_to_heads_that_follow tests/test_attention.py::test_joint_prologue_plan_conditions"
step 80 python3 -m pytest -q tests/test_aot.py -k "gpu" -p no:cacheprovider --tb=short > $OUT/pytest_aot_gpu.log 2>&1; tail -n 2 $OUT/pytest_aot_gpu.log
step 90 python3 -m pytest -q $T -p no:cacheprovider --tb=short > $OUT/pytest_attention_rest.log 2>&1; tail -n 2 $OUT/pytest_attention_rest.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
