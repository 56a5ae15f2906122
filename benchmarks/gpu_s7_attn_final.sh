#!/usr/bin/env bash
# Session 7: the attention table with the register cap on the H200: attention + AOT tests
# (the AOT packages carry maxnreg), then the attention bench rows (bf16, fp16, fp32).
source benchmarks/device_env.sh
BUDGET=260 step 250 python3 -m pytest tests/test_attention.py tests/test_aot.py tests/test_gn_builds.py -p no:cacheprovider -q --tb=short -rs \
  > $OUT/pytest_attn.log 2>&1; tail -4 $OUT/pytest_attn.log
BUDGET=520 step 250 python3 -m ditfuse bench --op attention --out-dir $OUT/bench_attn > $OUT/bench_attn.log 2>&1
grep -E "ditfuse-graph|flex" $OUT/bench_attn.log | head -30
echo "seconds used by the steps: $(( SECONDS - T0 ))"
