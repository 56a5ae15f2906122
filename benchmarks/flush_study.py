"""How the L2 state before a timed call moves small-shape results (session 14 diagnostic).

``graph_us`` (the bench's timer) replays a call after ``do_bench`` zeroes a 256 MB buffer:
the L2 (50 MB) is then full of *dirty* lines, which the timed call writes back as it
evicts them, while the dirty lines the call itself leaves are written back after the
timer stops. This times the same calls three ways (CUDA graphs, us a call, median):

  zero    do_bench's flush (zeroing 256 MB) before each call        -- the bench's timer
  read    a read-only pass over 256 MB before each call (a clean L2)
  stream  K calls on K distinct input sets back to back in one graph, per call: each call
          finds the previous call's lines in L2, as in a model's stream of kernels

for a contiguous copy of the op's bytes and for the ditfuse call, at registry shapes.
Usage: python benchmarks/flush_study.py [qk:NAME ...] [adaln:NAME] [gn:NAME]"""
import math
import sys

import torch
from triton.testing import do_bench

from ditfuse.bench import copy_ceiling_gbps
from tree_times import adaln_calls, gn_call, qk_call  # benchmarks/ is the script's directory

L2 = 50 * 2**20
_big = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device="cuda")


def _graph(fns):
    for f in fns:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    return g


def t_zero(fn):
    g = _graph([fn])
    return do_bench(g.replay, warmup=25, rep=100, return_mode="median") * 1e3


def t_read(fn, reps=60):
    g = _graph([fn])
    ts = []
    for _ in range(reps):
        _big.sum()  # a read of 256 MB: the L2 holds clean lines
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e3)
    return sorted(ts)[len(ts) // 2]


def t_stream(fns):
    g = _graph(fns)
    g.replay()
    ts = []
    for _ in range(40):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e3 / len(fns))
    return sorted(ts)[len(ts) // 2]


def study(label, make, nbytes, ceiling):
    K = max(2, min(8, math.ceil(3 * L2 / nbytes)))
    fns = [make() for _ in range(K)]
    half = nbytes // 4  # bf16 elements of each of the copy's source and destination
    pairs = [(torch.randn(half, device="cuda").to(torch.bfloat16),
              torch.empty(half, device="cuda", dtype=torch.bfloat16)) for _ in range(K)]
    copies = [lambda p=p: p[1].copy_(p[0]) for p in pairs]
    for what, fs in (("copy", copies), ("ditfuse", fns)):
        r = dict(zero=t_zero(fs[0]), read=t_read(fs[0]), stream=t_stream(fs))
        print(f"{label:28s} {what:8s} " + "  ".join(
            f"{k} {v:8.1f} us {nbytes / v / 1e3 / ceiling * 100:5.1f}%" for k, v in r.items()),
            flush=True)
    del fns, pairs, copies
    torch.cuda.empty_cache()


def main():
    ceiling = copy_ceiling_gbps()
    print(f"copy ceiling {ceiling:.0f} GB/s", flush=True)
    from ditfuse.shapes import ADALN_SHAPES, GN_SHAPES, QK_SHAPES
    for arg in sys.argv[1:]:
        op, name = arg.split(":")
        if op == "qk":
            sh = QK_SHAPES[name]
            nbytes = 4 * sh.B * sh.S * sh.H * sh.D * 2  # Q and K read and written (no table)
            study(f"qk {name}", lambda: qk_call(name, torch.bfloat16), nbytes, ceiling)
        elif op == "adaln":
            sh = ADALN_SHAPES[name]
            nbytes = 2 * sh.B * sh.S * sh.D * 2
            study(f"adaln_modulate {name}",
                  lambda: next(adaln_calls(name, torch.bfloat16))[1], nbytes, ceiling)
        elif op == "gn":
            sh = GN_SHAPES[name]
            nbytes = 2 * math.prod(sh.shape) * 2  # one read, one write (the copy's bytes)
            study(f"gn {name}", lambda: gn_call(name, torch.bfloat16), nbytes, ceiling)


if __name__ == "__main__":
    main()
