#!/usr/bin/env bash
# Session 22, last call: the GroupNorm / channel-RMS parity gates at the production shapes
# (the channels-last rows included), and the HunyuanVideo decode eager / compiled with the
# shipped policy (5-D pairs traced under compile).
source benchmarks/device_env.sh
BUDGET=400
step 150 python3 -c "
import torch
from ditfuse import group_norm as gn
class G:
    rows = []
    def add(self, gate, case, ok, detail):
        print(('PASS' if ok else 'FAIL'), gate, case, detail, flush=True)
gn.check_gates(G(), 'cuda', False)
" > $OUT/gn_gates.log 2>&1; cut -c1-160 $OUT/gn_gates.log
cd benchmarks
step 200 python3 vae_e2e.py hunyuan-256-9f --compile > $OUT/vae_e2e_hunyuan.log 2>&1; grep -v Warn $OUT/vae_e2e_hunyuan.log | tail -2
echo "seconds used by the steps: $(( SECONDS - T0 ))"
