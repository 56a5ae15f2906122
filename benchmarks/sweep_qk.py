"""Launch-settings sweep for qk_norm_rope on the GPU: heads per program x num_warps, per
registry shape (bf16), CUDA-graph device time with L2 flushed (bench.graph_us). Prints us,
% of the copy ceiling and whether the output equals the table's bitwise (the warps set the
order of the cross-warp sums); informs launch_settings().

usage: python benchmarks/sweep_qk.py [SHAPE,SHAPE,...] [WARPS,...] [bf16|fp16|fp32] [HEADS,...]
       (defaults: every registry shape; half, once and twice the table's warps; bf16; the
       table's heads per program. HEADS: fractions of H as "/2", "/4", or counts)"""
import sys

import torch

from ditfuse import qk_norm_rope as _f  # noqa: F401  (imports the module)
from ditfuse.bench import copy_ceiling_gbps, graph_us
from ditfuse.shapes import QK_SHAPES
from ditfuse.workloads import qk_bytes, qk_inputs

mod = sys.modules["ditfuse.qk_norm_rope"]
names = sys.argv[1].split(",") if len(sys.argv) > 1 else list(QK_SHAPES)
warps = [int(w) for w in sys.argv[2].split(",")] if len(sys.argv) > 2 else None
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
    sys.argv[3] if len(sys.argv) > 3 else "bf16"]
HEADS = sys.argv[4].split(",") if len(sys.argv) > 4 else None


def _heads(h, H, hg0):
    if h == "table":
        return hg0
    return H // int(h[1:]) if h.startswith("/") else int(h)
ceil = copy_ceiling_gbps()
print(f"copy ceiling {ceil:.0f} GB/s")
for name in names:
    shape = QK_SHAPES[name]
    inp = qk_inputs(shape, "cuda", DT)
    kw = dict(inp["kwargs"], q_norm=inp["q_norm"], k_norm=inp["k_norm"])
    p = mod.plan(inp["q"], inp["k"], inp["cos"], inp["sin"], **kw)
    qo, ko = torch.empty_like(p.q), torch.empty_like(p.k)  # out of place: replays are idempotent
    nbytes = qk_bytes(shape, DT)
    span_all = shape.span == "all"
    hg0, _, _, nw0 = mod.launch_settings(shape.H, shape.D, span_all, True,
                                           torch.empty((), dtype=DT).element_size())
    mod.launch(p, qo, ko)
    ref = (qo.clone(), ko.clone())
    res = []
    for hg, nw in [(_heads(h, shape.H, hg0), nw) for h in (HEADS or ["table"])
                   for nw in (warps or sorted({max(1, nw0 // 2), nw0, min(16, 2 * nw0)}))]:
        st = (hg, nw)
        try:
            us = graph_us(lambda st=st: mod.launch(p, qo, ko, settings=st))
            same = torch.equal(qo, ref[0]) and torch.equal(ko, ref[1])
        except Exception as e:  # noqa: BLE001
            print(f"{name} {st}: {type(e).__name__} {str(e)[:200]}", flush=True)
            continue
        pct = 100 * nbytes / (us * 1e-6) / 1e9 / ceil
        res.append((us, st, pct))
        mark = " <- table" if st == (hg0, nw0) else ""
        print(f"{name:20s} {str(DT)[6:]:8s} hg={hg:3d} nw={nw:2d} {us:9.1f} us {pct:6.1f}% "
              f"{'bitwise = table' if same else 'DIFFERS'}{mark}", flush=True)
    best = min(res)
    print(f"BEST {name:20s} hg,nw={best[1]} {best[0]:.1f} us {best[2]:.1f}%  (table: hg={hg0} nw={nw0})")
    torch.cuda.empty_cache()
