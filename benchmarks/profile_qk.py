"""Run qk_norm_rope once per named shape with given launch settings, for ncu.

usage: python benchmarks/profile_qk.py SHAPE HG NUM_WARPS [SHAPE HG NUM_WARPS ...]"""
import sys

import torch

import ditfuse  # noqa: F401
from ditfuse.shapes import QK_SHAPES
from ditfuse.workloads import qk_inputs

mod = sys.modules["ditfuse.qk_norm_rope"]
a = sys.argv[1:]
for i in range(0, len(a), 3):
    shape, hg, nw = QK_SHAPES[a[i]], int(a[i + 1]), int(a[i + 2])
    inp = qk_inputs(shape, "cuda", torch.bfloat16)
    p = mod.plan(inp["q"], inp["k"], inp["cos"], inp["sin"], q_norm=inp["q_norm"],
                 k_norm=inp["k_norm"], **inp["kwargs"])
    qo, ko = (p.q, p.k) if inp["buf"] is not None else (torch.empty_like(p.q), torch.empty_like(p.k))
    for _ in range(3):
        mod.launch(p, qo, ko, settings=(hg, nw))
    torch.cuda.synchronize()
