"""Launch-settings sweep of the fused activations (SwiGLU, GELU tanh) at the registry
shapes, bf16: (ROWS, BLOCK, num_warps), CUDA-graph device time with L2 flushed
(bench.graph_us), % of the copy ceiling, torch.compile of the eager code for reference, and
the share of outputs bitwise equal to eager PyTorch (SwiGLU: the contract says all).
Informs activations.launch_settings()."""
import torch
import torch.nn.functional as F

from ditfuse import activations as A
from ditfuse.bench import copy_ceiling_gbps, graph_us
from ditfuse.shapes import ACT_SHAPES

CONFIGS = [(1, 1024, 4), (1, 2048, 4), (1, 2048, 8), (2, 2048, 8), (4, 1024, 8), (2, 1024, 4),
           (1, 4096, 8), (1, 4096, 16), (4, 512, 4), (8, 512, 8)]
ceil = copy_ceiling_gbps()
print(f"copy ceiling {ceil:.0f} GB/s")
for name, sh in ACT_SHAPES.items():
    g = torch.Generator(device="cuda").manual_seed(0)
    proj = (torch.randn(sh.B, sh.S, sh.offset + sh.W, generator=g, device="cuda") * 2).to(torch.bfloat16)
    x = proj[..., sh.offset:]
    sw = sh.op == "swiglu"
    kind = A.SWIGLU if sw else A.GELU_TANH
    N = sh.N
    nbytes = (sh.W + N) * sh.B * sh.S * 2

    def eager(x=x, N=N, sw=sw):
        return F.silu(x[..., :N]) * x[..., N:] if sw else F.gelu(x, approximate="tanh")

    ref = eager()
    comp = torch.compile(eager)
    comp()
    us_c = graph_us(comp)
    table = A.launch_settings(N)
    print(f"{name:16s} compile {us_c:8.1f} us {100 * nbytes / (us_c * 1e-6) / 1e9 / ceil:6.1f}% "
          f"(table {table})", flush=True)
    res = []
    for cfg in CONFIGS:
        y = A._run(x, kind, settings=cfg)
        share = (y == ref).float().mean().item()
        us = graph_us(lambda cfg=cfg: A._run(x, kind, settings=cfg))
        pct = 100 * nbytes / (us * 1e-6) / 1e9 / ceil
        res.append((us, cfg, pct))
        print(f"{name:16s} {cfg} {us:8.1f} us {pct:6.1f}%  {100 * share:.3f}% bitwise eager"
              f"{' <- table' if tuple(cfg) == tuple(table) else ''}", flush=True)
    best = min(res)
    print(f"BEST {name} {best[1]} {best[0]:.1f} us {best[2]:.1f}% (compile {us_c:.1f} us)", flush=True)
