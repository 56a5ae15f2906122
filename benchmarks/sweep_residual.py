"""The gated residual alone (``ditfuse.gated_residual``) on the GPU: the flat kernel
(``adaln._residual_flat_kernel``) over (BLOCK, num_warps) against the tile kernel it
replaces on dense rows and torch.compile of the eager chain, at the registry's AdaLN shapes,
bf16, CUDA-graph time (L2 flushed by do_bench); outputs compared bit for bit with the tile
kernel's.

    python benchmarks/sweep_residual.py [BLOCK,warps ...]
"""
import sys

import torch

import ditfuse
from ditfuse import _fastpath, adaln
from ditfuse.bench import copy_ceiling_gbps, graph_us
from ditfuse.shapes import ADALN_SHAPES
from ditfuse.workloads import adaln_eager, adaln_inputs

SETTINGS = [tuple(int(v) for v in a.split(",")) for a in sys.argv[1:]] or \
    [(1024, 4), (2048, 4), (4096, 4), (2048, 8), (4096, 8), (1024, 2), (8192, 8)]
_fastpath.ENABLED = False  # the kernel choice changes at run time

ceil = copy_ceiling_gbps()
print(f"copy ceiling {ceil:.0f} GB/s")
for name, shape in ADALN_SHAPES.items():
    s = adaln_inputs(shape, "cuda", torch.bfloat16, seed=0)
    per_op = "per_op" if shape.model == "flux" else "once"
    n = shape.B * shape.S * shape.D
    nbytes = 3 * n * 2 + (n * 4 if shape.per_token else 0)

    def call():
        return ditfuse.gated_residual(s["x"], s["y"], s["gate"], rounding=per_op)

    def row(label, us, err=""):
        pct = 100 * nbytes / (us * 1e-6) / 1e9 / ceil
        print(f"{name:16s} {label:22s} {us:8.1f} us {pct:6.1f}% {err}", flush=True)

    adaln.RESIDUAL_FLAT = False
    ref = call()
    row("tile kernel", graph_us(call))
    adaln.RESIDUAL_FLAT = True
    for st in [None] + SETTINGS:
        adaln.RESIDUAL_SETTINGS = st
        try:
            out = call()
            diff = (out != ref).sum().item()
            row("flat " + ("table" if st is None else f"{st[0]} x {st[1]} warps"), graph_us(call),
                f"elements differing from the tile kernel: {diff}")
        finally:
            adaln.RESIDUAL_SETTINGS = None
    eager = adaln_eager(shape)[2]
    comp = torch.compile(lambda: eager(s))
    for _ in range(3):
        comp()
    row("torch.compile", graph_us(comp))
