"""The persistent TMA-fed qk_norm_rope kernel against the per-token one, per registry shape
where it applies (bf16; Wan also fp32): CUDA-graph device time with L2 flushed
(bench.graph_us), % of the copy ceiling, and whether the TMA output equals the per-token
kernel's bitwise (else the largest difference). Sweeps (num_warps, stages, programs per
SM); informs tma_settings().

usage: python benchmarks/sweep_qk_tma.py [SHAPE,SHAPE,...]"""
import itertools
import sys

import torch

from ditfuse import qk_norm_rope as _f  # noqa: F401  (imports the module)
from ditfuse.bench import copy_ceiling_gbps, graph_us
from ditfuse.shapes import QK_SHAPES
from ditfuse.workloads import qk_bytes, qk_inputs

mod = sys.modules["ditfuse.qk_norm_rope"]
names = sys.argv[1].split(",") if len(sys.argv) > 1 else list(QK_SHAPES)
ceil = copy_ceiling_gbps()
print(f"copy ceiling {ceil:.0f} GB/s")
GRID = list(itertools.product((8, 16), (2, 3, 4), (1, 2, 3)))
cases = [(n, torch.bfloat16) for n in names] + [("wan14b-480p", torch.float32)]
for name, dt in cases:
    shape = QK_SHAPES[name]
    inp = qk_inputs(shape, "cuda", dt)
    kw = dict(inp["kwargs"], q_norm=inp["q_norm"], k_norm=inp["k_norm"])
    p = mod.plan(inp["q"], inp["k"], inp["cos"], inp["sin"], **kw)
    if not mod.tma_applies(p):
        print(f"{name}: TMA kernel does not apply", flush=True)
        continue
    qo, ko = torch.empty_like(p.q), torch.empty_like(p.k)
    nbytes = qk_bytes(shape) * (2 if dt == torch.float32 else 1)
    span_all = shape.span == "all"
    hg0, _, _, nw0 = mod.launch_settings(shape.H, shape.D, span_all, True, p.q.element_size())
    mod.launch(p, qo, ko, settings=(hg0, nw0))  # the per-token kernel
    ref = (qo.clone(), ko.clone())
    us0 = graph_us(lambda: mod.launch(p, qo, ko, settings=(hg0, nw0)))
    pct0 = 100 * nbytes / (us0 * 1e-6) / 1e9 / ceil
    print(f"{name:20s} {str(dt)[6:]:8s} per-token      {us0:9.1f} us {pct0:6.1f}%", flush=True)
    table = mod.tma_settings(shape.H, shape.D, p.q.element_size(), True, span_all)
    res = []
    for nw, st, per_sm in GRID:
        s = (hg0, nw, st, per_sm)
        try:
            qo.fill_(float("nan"))
            ko.fill_(float("nan"))
            mod.launch_tma(p, qo, ko, settings=s)
            d = max((qo.float() - ref[0].float()).abs().max().item(),
                    (ko.float() - ref[1].float()).abs().max().item())
            same = torch.equal(qo, ref[0]) and torch.equal(ko, ref[1])
            us = graph_us(lambda s=s: mod.launch_tma(p, qo, ko, settings=s))
        except Exception as e:  # noqa: BLE001
            print(f"{name} {s}: {type(e).__name__} {str(e)[:300]}", flush=True)
            continue
        pct = 100 * nbytes / (us * 1e-6) / 1e9 / ceil
        res.append((us, s, pct))
        mark = " <- table" if (nw, st, per_sm) == (table[3], table[4], table[5]) else ""
        print(f"{name:20s} {str(dt)[6:]:8s} tma nw={nw:2d} st={st} sm={per_sm} {us:9.1f} us "
              f"{pct:6.1f}% {'bitwise = per-token' if same else f'max|d| {d:.3g}'}{mark}",
              flush=True)
    if res:
        best = min(res)
        print(f"BEST {name:20s} {str(dt)[6:]} tma {best[1]} {best[0]:.1f} us {best[2]:.1f}% "
              f"(per-token {us0:.1f} us {pct0:.1f}%)", flush=True)
    torch.cuda.empty_cache()
