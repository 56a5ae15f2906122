"""Launch-settings sweep for qk_norm_rope on the GPU: heads per program x num_warps, per
registry shape (bf16). Prints us and % of the copy ceiling; informs launch_settings().

usage: python benchmarks/sweep_qk.py [SHAPE,SHAPE,...] [WARPS,WARPS,...]  (default: all, 2,4,8,16)"""
import sys

import torch

from ditfuse import qk_norm_rope as _f  # noqa: F401  (imports the module)
from ditfuse.bench import _median_us, copy_ceiling_gbps
from ditfuse.shapes import QK_SHAPES
from ditfuse.workloads import qk_bytes, qk_inputs

mod = sys.modules["ditfuse.qk_norm_rope"]
names = sys.argv[1].split(",") if len(sys.argv) > 1 else list(QK_SHAPES)
warps = [int(w) for w in sys.argv[2].split(",")] if len(sys.argv) > 2 else [2, 4, 8, 16]
ceil = copy_ceiling_gbps()
print(f"copy ceiling {ceil:.0f} GB/s")
for name in names:
    shape = QK_SHAPES[name]
    inp = qk_inputs(shape, "cuda", torch.bfloat16)
    kw = dict(inp["kwargs"], q_norm=inp["q_norm"], k_norm=inp["k_norm"])
    p = mod.plan(inp["q"], inp["k"], inp["cos"], inp["sin"], **kw)
    inplace = inp["buf"] is not None
    if inplace:
        qo, ko = p.q, p.k
    else:
        qo, ko = torch.empty_like(p.q), torch.empty_like(p.k)
    nbytes = qk_bytes(shape)
    span_all = shape.span == "all"
    hgs = [shape.H] if span_all else sorted({shape.H, 8, 16} - {0})
    default = mod.launch_settings(shape.H, shape.D, span_all, True)
    res = []
    for hg, nw, bc in [(h, n, b) for h in hgs for n in warps for b in (False,)]:
        if nw * 32 * 4 > hg * shape.D * 2:  # fewer than 4 elements a thread
            continue
        if True:
            try:
                def f(p=p, qo=qo, ko=ko, hg=hg, nw=nw):
                    return mod.launch(p, qo, ko, settings=(hg, nw))
                f()
                us = _median_us(f)
            except Exception as e:  # noqa: BLE001
                print(f"{name} hg={hg} nw={nw}: {type(e).__name__} {e}")
                continue
            pct = 100 * nbytes / (us * 1e-6) / 1e9 / ceil
            res.append((us, hg, nw, pct, bc))
            mark = " <- table" if (hg, nw, bc) == (default[0], default[3], False) else ""
            print(f"{name:20s} hg={hg:3d} nw={nw:2d} split={bc:d} {us:9.1f} us {pct:6.1f}%{mark}", flush=True)
    best = min(res)
    print(f"BEST {name:20s} hg={best[1]} nw={best[2]} split={best[4]} {best[0]:.1f} us {best[3]:.1f}%  (table: hg={default[0]} nw={default[3]})")
    torch.cuda.empty_cache()
