"""GroupNorm + SiLU (and the channel RMS) on channels-last input against contiguous input
(session 22).

The VAE patch hands the kernel whatever layout the convolutions produce; under
torch.compile inductor may pick channels-last for the convolutions. CUDA-graph time (us)
of ditfuse on the same values in both layouts, and of torch.compile of the eager pair on
channels-last, at the registry's GroupNorm shapes, bf16; max |d| between the layouts.

    PYTHONPATH=src python benchmarks/gn_layout.py [shape ...]

LAUNCH='{"cl_lanes": 64}': launch-table overrides for the channels-last calls (``_launch``);
NOCOMPILE=1: no torch.compile column.
"""
import json
import os
import sys

import torch
import torch.nn.functional as F

import ditfuse
from ditfuse.bench import graph_us
from ditfuse.shapes import GN_SHAPES

launch = json.loads(os.environ.get("LAUNCH", "null"))
names = sys.argv[1:] or list(GN_SHAPES)
for name in names:
    sh = GN_SHAPES[name]
    C = sh.shape[1]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(sh.shape, generator=g, device="cuda") * 2 + 0.5).to(torch.bfloat16)
    ps = (C,) if sh.op == "gn" else (C,) + (1,) * (x.dim() - 2)
    w = (torch.randn(ps, generator=g, device="cuda") * 0.5 + 1).to(torch.bfloat16)
    b = (torch.randn(ps, generator=g, device="cuda") * 0.2).to(torch.bfloat16)
    fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
    xl = x.contiguous(memory_format=fmt)
    if sh.op == "gn":
        def op(t, _launch=None):
            return ditfuse.group_norm_silu(t, sh.groups, w, b, 1e-6, _launch=_launch)

        def eager(t):
            return F.silu(F.group_norm(t, sh.groups, w, b, 1e-6))
    else:
        def op(t, _launch=None):
            return ditfuse.rms_norm_silu_channels(t, w, b, _launch=_launch)

        def eager(t):  # WanRMS_norm (channel first) -> SiLU in bf16
            return F.silu(F.normalize(t.float(), dim=1).to(t.dtype) * (C ** 0.5) * w + b)
    t_c = graph_us(lambda: op(x))
    t_l = graph_us(lambda: op(xl, launch))
    if os.environ.get("NOCOMPILE"):
        t_k = float("nan")
    else:
        comp = torch.compile(eager)
        t_k = graph_us(lambda: comp(xl))
    yc = op(x)
    yl = op(xl, launch)
    d = (yc.float() - yl.float()).abs().max().item()
    print(f"{name:20s} contiguous {t_c:8.1f} us  channels-last {t_l:8.1f} us  "
          f"compile(channels-last) {t_k:8.1f} us  max|d| {d:.3g}  out strides {yl.stride()}",
          flush=True)
