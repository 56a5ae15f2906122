"""Register caps (ptxas .maxnreg) for the GroupNorm split path's launches and the channel
RMS (session 21). A cap changes how many programs fit an SM, not the arithmetic: every
variant's output is compared bitwise with the table's. bf16 (and fp16 for the RMS), CUDA
graphs, L2 flushed before each replay; the table first and last (drift).

    PYTHONPATH=src python benchmarks/gn_caps.py
"""
import torch

from ditfuse import group_norm as gn
from ditfuse.bench import graph_us
from tree_times import gn_call  # benchmarks/ is the script's directory

GN = {  # shape: launch overrides to try (4-warp statistics: 95 registers uncapped, 80 fits
    # 6 programs an SM; the 8-warp statistics 61 -> 48: 5; the apply pass 56 -> 48: 10)
    "flux-vae-up1-256": [dict(stats_maxnreg=80), dict(apply_maxnreg=48),
                         dict(stats_maxnreg=80, apply_maxnreg=48), dict(stats_maxnreg=64)],
    "hunyuan-vae-up-9f": [dict(stats_maxnreg=80), dict(apply_maxnreg=48),
                          dict(stats_maxnreg=80, apply_maxnreg=48), dict(stats_maxnreg=64)],
    "flux-vae-up2-512": [dict(stats_maxnreg=48), dict(apply_maxnreg=48),
                         dict(stats_maxnreg=48, apply_maxnreg=48)],
    "flux-vae-out-1024": [dict(stats_maxnreg=48), dict(apply_maxnreg=48),
                          dict(stats_maxnreg=48, apply_maxnreg=48)],
    "flux-vae-mid-128": [dict(stats_maxnreg=72), dict(apply_maxnreg=48)],
    "hunyuan-vae-mid": [dict(stats_maxnreg=72), dict(apply_maxnreg=48)],
}
for name, variants in GN.items():
    f0 = gn_call(name, torch.bfloat16)
    y0 = f0().clone()
    print(f"{name:20s} table            {graph_us(f0):8.1f} us", flush=True)
    for v in variants:
        f = gn_call(name, torch.bfloat16, v)
        same = torch.equal(f(), y0)
        print(f"{name:20s} {str(v):40s} {graph_us(f):8.1f} us  bitwise {same}", flush=True)
    print(f"{name:20s} table again      {graph_us(f0):8.1f} us", flush=True)
for name in ("wan-vae-out-480p", "wan-vae-mid-480p"):
    for dt in (torch.bfloat16, torch.float16):
        f0 = gn_call(name, dt)
        f1 = gn_call(name, dt, dict(maxnreg=0))
        same = torch.equal(f0(), f1())
        t0, t1 = graph_us(f0), graph_us(f1)
        t0b, t1b = graph_us(f0), graph_us(f1)
        print(f"{name:20s} {str(dt):15s} cap {gn.RMS_MAXNREG}: {t0:7.1f} {t0b:7.1f} us  "
              f"uncapped: {t1:7.1f} {t1b:7.1f} us  bitwise {same}", flush=True)
