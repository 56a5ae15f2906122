"""GroupNorm + SiLU on channels-last input against contiguous input (session 22).

The VAE patch hands the kernel whatever layout the convolutions produce; under
torch.compile inductor may pick channels-last for the convolutions. CUDA-graph time (us)
of ditfuse on the same values in both layouts, and of torch.compile of the eager pair on
channels-last, at the registry's GroupNorm shapes, bf16; max |d| between the layouts.

    PYTHONPATH=src python benchmarks/gn_layout.py [shape ...]
"""
import sys

import torch
import torch.nn.functional as F

import ditfuse
from ditfuse.bench import graph_us
from ditfuse.shapes import GN_SHAPES

names = sys.argv[1:] or [n for n, s in GN_SHAPES.items() if s.op == "gn"]
for name in names:
    sh = GN_SHAPES[name]
    C = sh.shape[1]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(sh.shape, generator=g, device="cuda") * 2 + 0.5).to(torch.bfloat16)
    w = (torch.randn(C, generator=g, device="cuda") * 0.5 + 1).to(torch.bfloat16)
    b = (torch.randn(C, generator=g, device="cuda") * 0.2).to(torch.bfloat16)
    fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
    xl = x.contiguous(memory_format=fmt)
    t_c = graph_us(lambda: ditfuse.group_norm_silu(x, sh.groups, w, b, 1e-6))
    t_l = graph_us(lambda: ditfuse.group_norm_silu(xl, sh.groups, w, b, 1e-6))
    comp = torch.compile(lambda t: F.silu(F.group_norm(t, sh.groups, w, b, 1e-6)))
    t_k = graph_us(lambda: comp(xl))
    yc = ditfuse.group_norm_silu(x, sh.groups, w, b, 1e-6)
    yl = ditfuse.group_norm_silu(xl, sh.groups, w, b, 1e-6)
    d = (yc.float() - yl.float()).abs().max().item()
    print(f"{name:20s} contiguous {t_c:8.1f} us  channels-last {t_l:8.1f} us  "
          f"compile(channels-last) {t_k:8.1f} us  max|d| {d:.3g}  out strides {yl.stride()}",
          flush=True)
