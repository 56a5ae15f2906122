"""Where the time of one qk_norm_rope call goes: direct launch vs the public function,
GPU time (CUDA graph replay) vs host time (perf_counter)."""
import sys
import time

import torch
from triton.testing import do_bench

import ditfuse
from ditfuse.shapes import QK_SHAPES
from ditfuse.workloads import qk_inputs

mod = sys.modules["ditfuse.qk_norm_rope"]
for name in ["flux1-1024", "sa3-dit"]:
    shape = QK_SHAPES[name]
    inp = qk_inputs(shape, "cuda", torch.bfloat16)
    kw = dict(inp["kwargs"], q_norm=inp["q_norm"], k_norm=inp["k_norm"])
    p = mod.plan(inp["q"], inp["k"], inp["cos"], inp["sin"], **kw)
    qo, ko = torch.empty_like(p.q), torch.empty_like(p.k)
    direct = lambda: mod.launch(p, qo, ko)
    public = lambda: ditfuse.qk_norm_rope(inp["q"], inp["k"], inp["cos"], inp["sin"], **kw)
    planonly = lambda: mod.plan(inp["q"], inp["k"], inp["cos"], inp["sin"], **kw)
    for f in (direct, public):
        f()
    torch.cuda.synchronize()
    res = {}
    for label, f in (("direct", direct), ("public", public)):
        res[label + " do_bench"] = do_bench(f, return_mode="median") * 1e3
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(200):
            f()
        res[label + " host"] = (time.perf_counter() - t) / 200 * 1e6
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(200):
        planonly()
    res["plan host"] = (time.perf_counter() - t) / 200 * 1e6
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        direct()
    res["graph replay do_bench"] = do_bench(g.replay, return_mode="median") * 1e3
    print(name, {k: round(v, 1) for k, v in res.items()}, flush=True)
