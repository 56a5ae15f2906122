"""Where the resident GroupNorm path's time goes (CUDA-graph us, bf16): the resident launch
(statistics, grid barrier, apply), the same kernel's two halves as two ordinary launches (no
barrier; the apply half loads x again), the split path, a copy of x and a read-only sum of
x. Usage: python benchmarks/gn_resident_diag.py [SHAPE ...]."""
import sys

import torch

from ditfuse import _runtime
from ditfuse import group_norm as gn
from ditfuse.bench import graph_us
from tree_times import gn_call  # benchmarks/ is the script's directory

names = sys.argv[1:] or ["flux-vae-mid-128", "hunyuan-vae-mid"]
for name in names:
    x = torch.randn(gn.GN_SHAPES[name].shape, device="cuda").to(torch.bfloat16)
    y = torch.empty_like(x)
    rows = [("resident", gn_call(name, torch.bfloat16)),
            ("split", gn_call(name, torch.bfloat16, {"resident": 0})),
            ("copy", lambda: y.copy_(x)),
            ("sum", lambda: x.sum(dtype=torch.float32))]
    for tag, f in rows:
        print(f"{name:18s} {tag:10s} {graph_us(f):8.1f} us", flush=True)
    _runtime.INTERPRET = True  # the launcher's two-halves branch, on the GPU
    try:
        f = gn_call(name, torch.bfloat16, {"resident_tile": 16384})
        gn._CACHE.clear()
        print(f"{name:18s} {'halves':10s} {graph_us(f):8.1f} us", flush=True)
    finally:
        _runtime.INTERPRET = False
        gn._CACHE.clear()
