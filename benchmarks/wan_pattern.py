"""Where Wan's QK-norm + RoPE time goes against a copy (session 14 diagnostic; CUDA-graph us,
L2 flushed as the bench does). Wan's Q and K are chunks 0 and 1 of the fused QKV
projection's (1, S, 3 x 5120) rows, normalised in place; ditfuse's flat kernel runs a
program a (token, Q or K) with the row as two power-of-two pieces (4096 + 1024) at 2 warps.
The same grid and pieces with less work isolate each part:

  copy        a contiguous torch copy of the same bytes (the ceiling's kind of traffic)
  torch-mul   q.mul_(1), k.mul_(1) on the strided views (torch's in-place elementwise)
  rows        load the row, store it back: the access pattern alone (in place)
  rows-out    the same into a fresh (1, S, 5120) buffer a tensor
  rows-norm   load, sum of squares (the cross-warp sum), scale, store (in place)
  ditfuse     the registry call (in place)   ditfuse-out: out of place
  ditfuse-chan the call in the flat kernel's channel form (before session 14's pair form)
  ditfuse-half the call with Wan's columns packed as half-width tables (one value a pair)

    python benchmarks/wan_pattern.py [wan14b-480p ...] [--warps N] [--separate]

--separate: Q and K tensors of their own, (1, S, 5120) each (diffusers' Wan without
``fuse_projections``: ``to_q`` / ``to_k`` outputs), instead of chunks of the fused QKV rows.
"""
import dataclasses
import importlib
import sys

import torch
import triton
import triton.language as tl

import ditfuse
from ditfuse.bench import copy_ceiling_gbps, graph_us
from ditfuse.shapes import QK_SHAPES
from ditfuse.workloads import qk_inputs


@triton.jit
def _rows_kernel(x_ptr, y_ptr, k_off, stride_xs, stride_ys, y_k_off, eps,
                 N0: tl.constexpr, N1: tl.constexpr, NORM: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    xb = x_ptr + t * stride_xs + j * k_off
    yb = y_ptr + t * stride_ys + j * y_k_off
    c0 = tl.arange(0, N0)
    c1 = N0 + tl.arange(0, N1)
    a = tl.load(xb + c0)
    b = tl.load(xb + c1)
    if NORM:
        af = a.to(tl.float32)
        bf = b.to(tl.float32)
        ss = tl.sum(af * af) + tl.sum(bf * bf)
        r = 1.0 / tl.sqrt(ss / (N0 + N1) + eps)
        a = (af * r).to(a.dtype)
        b = (bf * r).to(b.dtype)
    tl.store(yb + c0, a)
    tl.store(yb + c1, b)


def _channel_form(f):
    """``f`` with the flat kernel's channel form (``qk_norm_rope.PAIRS = False``)."""
    Q = importlib.import_module("ditfuse.qk_norm_rope")

    def g():
        Q.PAIRS = False
        try:
            return f()
        finally:
            Q.PAIRS = True
    return g


def main():
    warps = int(sys.argv[sys.argv.index("--warps") + 1]) if "--warps" in sys.argv else 2
    names = [a for a in sys.argv[1:] if a in QK_SHAPES] or ["wan14b-480p"]
    ceiling = copy_ceiling_gbps()
    print(f"copy ceiling {ceiling:.0f} GB/s", flush=True)
    for name in names:
        sh = QK_SHAPES[name]
        sep = "--separate" in sys.argv
        # (the registry's Wan rows are the separate form since session 14; -fused the other)
        sh = dataclasses.replace(sh, packed=0 if sep else 3)
        inp = qk_inputs(sh, "cuda", torch.bfloat16)
        q, k, buf = inp["q"], inp["k"], inp["buf"]
        S, HD = sh.S, sh.H * sh.D
        if sep:  # the rows kernels' view: Q and K as one (1, S, 2 x 5120)-strided pair
            buf = torch.empty(2, S, HD, device="cuda", dtype=torch.bfloat16)
            buf[0].copy_(q[0])
            buf[1].copy_(k[0])
            name = name + "-sep"
        nbytes = 4 * S * HD * 2
        src = torch.randn(nbytes // 4, device="cuda").to(torch.bfloat16)
        dst = torch.empty_like(src)
        out = torch.empty(2, S, HD, device="cuda", dtype=torch.bfloat16)
        N0 = 1 << (HD.bit_length() - 1)
        N1 = HD - N0
        assert N1 & (N1 - 1) == 0

        def rows(norm, into=None):
            # x: Q rows at buf + t * row stride, K rows k_off elements further
            xs = buf.stride(1)
            xk = S * HD if sep else HD
            y = buf if into is None else into
            ys = y.stride(1)
            yk = xk if into is None else S * HD
            return lambda: _rows_kernel[(S, 2)](buf, y, xk, xs, ys, yk, 1e-6,
                                                N0=N0, N1=N1, NORM=norm, num_warps=warps)

        kw = dict(inp["kwargs"], q_norm=inp["q_norm"], k_norm=inp["k_norm"])
        half_cos = inp["call_cos"][..., 0::2].contiguous()
        half_sin = inp["call_sin"][..., 0::2].contiguous()
        calls = [
            ("copy", lambda: dst.copy_(src)),
            ("torch-mul", lambda: (q.mul_(1.0), k.mul_(1.0))),
            ("rows", rows(False)),
            ("rows-out", rows(False, out)),
            ("rows-norm", rows(True)),
            ("ditfuse", lambda: ditfuse.qk_norm_rope(q, k, inp["call_cos"], inp["call_sin"],
                                                     inplace=True, **kw)),
            ("ditfuse-out", lambda: ditfuse.qk_norm_rope(q, k, inp["call_cos"], inp["call_sin"],
                                                         **kw)),
            ("ditfuse-chan", _channel_form(lambda: ditfuse.qk_norm_rope(
                q, k, inp["call_cos"], inp["call_sin"], inplace=True, **kw))),
            # Wan's own columns packed, one value a pair (the pair form's half-table path:
            # a thread's table values in one 16-byte load; not what the processor passes yet)
            ("ditfuse-half", lambda: ditfuse.qk_norm_rope(q, k, half_cos, half_sin,
                                                          inplace=True, **kw)),
        ]
        for tag, f in calls:
            us = graph_us(f)
            print(f"{name:14s} {tag:12s} {us:8.1f} us {nbytes / us / 1e3 / ceiling * 100:6.1f}%",
                  flush=True)


if __name__ == "__main__":
    main()
