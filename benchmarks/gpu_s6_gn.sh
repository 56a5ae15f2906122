#!/usr/bin/env bash
# Session 6: GroupNorm on the H200. The GroupNorm / fast-path tests on CUDA, the check gates
# at the VAE shapes, a sweep against torch.compile (calls 1-2: --fused, the one-launch path,
# LOST and removed; call 3: --apply, wider apply tiles), the bench rows of every GroupNorm
# shape. Carry .whl.
source benchmarks/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
step 200 python3 -m pytest tests/test_group_norm.py tests/test_fastpath.py -p no:cacheprovider -q -x --tb=short -k "split or replay or poison or strided or slice or agree" \
  > $OUT/pytest_gn.log 2>&1; tail -4 $OUT/pytest_gn.log
step 90 python3 - > $OUT/check_gn.log 2>&1 <<'PY'
import torch, ditfuse
from ditfuse import group_norm as gn
class G:
    def add(self, gate, case, ok, detail): print("PASS" if ok else "FAIL", gate, case, detail, flush=True)
gn.check_gates(G(), "cuda", False)
PY
grep -c PASS $OUT/check_gn.log; grep -E "FAIL|Error" $OUT/check_gn.log | head
step 200 python3 benchmarks/sweep_gn.py --apply > $OUT/sweep_gn_apply.log 2>&1; grep -v Warn $OUT/sweep_gn_apply.log | grep -E "BEST|compile" | head -40
step 150 python3 -m ditfuse bench --op group_norm --dtypes bf16 --extra-dtypes "" --out-dir $OUT/bench_gn > $OUT/bench_gn.log 2>&1; grep -E "ditfuse" $OUT/bench_gn.log | head -20
echo "seconds used by the steps: $(( SECONDS - T0 ))"
