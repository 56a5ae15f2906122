#!/usr/bin/env bash
# Session 6: the split path with the next tile prefetched in the statistics loop (call 1
# also issued the apply pass's tile loads before its merge of the partials: LOST; call 2
# without that, MODE=2): each pass alone (diag_gn_passes.py; before: logs/s6/diag), the
# GroupNorm tests (call 1) and check gates on CUDA, the bench rows of every GroupNorm shape.
# Carry .whl.
source benchmarks/device_env.sh
step 150 python3 benchmarks/diag_gn_passes.py > $OUT/diag_gn_passes.log 2>&1; grep -v Warn $OUT/diag_gn_passes.log | grep -E "table|copy|sum"
[[ $MODE == 2 ]] || step 150 python3 -m pytest tests/test_group_norm.py tests/test_fastpath.py -p no:cacheprovider -q -x --tb=short -k "split or replay or poison or strided or slice or agree or fp64" \
  > $OUT/pytest_gn.log 2>&1; tail -2 $OUT/pytest_gn.log
step 90 python3 - > $OUT/check_gn.log 2>&1 <<'PY'
import torch, ditfuse
from ditfuse import group_norm as gn
class G:
    def add(self, gate, case, ok, detail): print("PASS" if ok else "FAIL", gate, case, detail, flush=True)
gn.check_gates(G(), "cuda", False)
PY
grep -c PASS $OUT/check_gn.log; grep -E "FAIL|Error" $OUT/check_gn.log | head
step 150 python3 -m ditfuse bench --op group_norm --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench_gn > $OUT/bench_gn.log 2>&1; grep -E "ditfuse-graph" $OUT/bench_gn.log | head -8
echo "seconds used by the steps: $(( SECONDS - T0 ))"
