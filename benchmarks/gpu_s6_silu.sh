#!/usr/bin/env bash
# Session 6's last device minutes: GroupNorm / channel RMS with SiLU's exp2 and division as
# single ex2.approx.ftz / div.approx.ftz instructions and rstd * w folded per channel (the
# apply pass is bound by instruction issue: 1144 -> 896 SASS instructions, RMS 1288 -> 984).
# Times first (graph_us, as the bench's ditfuse-graph column), then the check gates.
source benchmarks/device_env.sh
BUDGET=100 step 60 python3 - > $OUT/silu_times.log 2>&1 <<'PY'
import math, torch, ditfuse
from ditfuse.bench import graph_us
from ditfuse.shapes import GN_SHAPES
for name in ("flux-vae-out-1024", "flux-vae-up1-256", "hunyuan-vae-up-9f", "wan-vae-out-480p", "flux-vae-mid-128"):
    sh = GN_SHAPES[name]; C = sh.shape[1]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(sh.shape, generator=g, device="cuda") * 2 + 0.5).to(torch.bfloat16)
    ps = (C,) + (1,) * (len(sh.shape) - 2) if sh.op == "rms" else (C,)
    w = (torch.randn(ps, generator=g, device="cuda") * 0.5 + 1).to(torch.bfloat16)
    b = (torch.randn(ps, generator=g, device="cuda") * 0.2).to(torch.bfloat16)
    f = (lambda: ditfuse.rms_norm_silu_channels(x, w, b)) if sh.op == "rms" else \
        (lambda: ditfuse.group_norm_silu(x, sh.groups, w, b, 1e-6))
    print(f"{name:20s} {graph_us(f):8.1f} us", flush=True)
PY
cat $OUT/silu_times.log | grep " us"
BUDGET=100 step 40 python3 - > $OUT/check_gn.log 2>&1 <<'PY'
import torch, ditfuse
from ditfuse import group_norm as gn
class G:
    def add(self, gate, case, ok, detail): print("PASS" if ok else "FAIL", gate, case, detail, flush=True)
gn.check_gates(G(), "cuda", False)
PY
grep -c PASS $OUT/check_gn.log; grep -E "FAIL|Error" $OUT/check_gn.log | head
echo "seconds used by the steps: $(( SECONDS - T0 ))"
