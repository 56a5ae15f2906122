#!/usr/bin/env bash
# Session 8, fifth call: GPU tests of the changed ops, the QK-norm + RoPE bench rows (every
# registry shape, bf16 + the fp16/fp32 rows) with the flat-row kernel, SAME's public
# attention call with its prologue apart.
source benchmarks/device_env.sh
BUDGET=560
step 170 python3 -m pytest tests/test_qk_norm_rope.py tests/test_qk_tma.py tests/test_fastpath.py tests/test_attention.py tests/test_aot.py tests/test_inspect.py -p no:cacheprovider -q --tb=short -x -rs > $OUT/pytest.log 2>&1
tail -4 $OUT/pytest.log
step 250 python3 -m ditfuse bench --op qk_norm_rope --out-dir $OUT/bench_qk > $OUT/bench_qk.log 2>&1
grep -E "ditfuse-graph|ceiling" $OUT/bench_qk.log | head -30
step 100 python3 benchmarks/attn_prologue_ab.py > $OUT/attn_prologue_ab.log 2>&1
grep -E "public|fused" $OUT/attn_prologue_ab.log
echo "seconds used by the steps: $(( SECONDS - T0 ))"
