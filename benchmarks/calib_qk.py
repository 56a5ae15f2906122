"""Calibration of the Wan QK-norm + RoPE kernels on the GPU (session 8 diagnostic).

performance.md says a plain one-token-per-program Triton kernel reached 89.7% of the copy
ceiling at Wan 480p on this GPU; ditfuse's per-token kernel measured 81% and its TMA kernel
84.7%. This script times, on the registry's Wan inputs (the packed projection's q / k
views, (1, S, 1, 128) fp32 tables, bf16 weights across all 5120 channels), side by side in
one process (CUDA-graph replay, L2 flushed): plain kernels written here -- a token's
channels as one flat [pairs, 2] tile, Q and K in one program or in two -- at several
warps, ditfuse's per-token and TMA kernels, and a torch copy of the same bytes. Not a
shipped kernel: the arithmetic is diffusers' (RMS across heads, weight, interleaved RoPE)
but only checked against ditfuse to 1 bf16 ulp, to be sure the timed work is the same.

    python benchmarks/calib_qk.py [--ncu] [--all] [--fp32 | --fp16] [wan14b-480p ...]
    (--ncu: launches only; --all: every plain variant and a torch copy; ditfuse's flat-row
    kernel at 4 / 8 / 16 warps where it applies)
"""
import importlib
import sys

import torch
import triton
import triton.language as tl

from ditfuse.bench import copy_ceiling_gbps, graph_us
from ditfuse.shapes import QK_SHAPES
from ditfuse.workloads import qk_inputs

# (num_warps, Q and K in programs of their own, ptxas register cap) of the flat kernel
FLAT_VARIANTS = [(2, True, None), (4, False, None)]
DTYPE = torch.float32 if "--fp32" in sys.argv else (
    torch.float16 if "--fp16" in sys.argv else torch.bfloat16)
Q = importlib.import_module("ditfuse.qk_norm_rope")  # the package exports a function of that name


@triton.jit
def _load(x_ptr, base, i, C: tl.constexpr):
    off = 2 * i[:, None] + tl.arange(0, 2)[None, :]
    return tl.load(x_ptr + base + off, mask=off < C, other=0.0).to(tl.float32)


@triton.jit
def _finish(x, o_ptr, obase, w_ptr, cos_ptr, sin_ptr, tbase, i, eps,
            C: tl.constexpr, R: tl.constexpr, EXACT: tl.constexpr):
    off = 2 * i[:, None] + tl.arange(0, 2)[None, :]
    m = off < C
    ss = tl.sum(tl.sum(x * x, 1), 0)
    rstd = 1.0 / tl.sqrt(ss / C + eps)
    w = tl.load(w_ptr + off, mask=m, other=0.0).to(tl.float32)
    if EXACT:  # torch.nn.RMSNorm's arithmetic (fp32 weight product, one rounding) and a
        # table read per channel, as ditfuse must: the timed work of the shipped kernels
        y = (x * rstd * w).to(tl.bfloat16).to(tl.float32)
        a, b = tl.split(y)
        t = off % R
        ca, cb = tl.split(tl.load(cos_ptr + tbase + t, mask=m, other=0.0))
        sa, sb = tl.split(tl.load(sin_ptr + tbase + t, mask=m, other=0.0))
        oa = a * ca - b * sa
        ob = b * cb + a * sb
    else:
        y = (x * rstd).to(tl.bfloat16).to(tl.float32) * w
        y = y.to(tl.bfloat16).to(tl.float32)
        a, b = tl.split(y)
        t = (2 * i) % R
        c = tl.load(cos_ptr + tbase + t)
        s = tl.load(sin_ptr + tbase + t + 1)
        oa = a * c - b * s
        ob = a * s + b * c
    tl.store(o_ptr + obase + off, tl.join(oa, ob).to(o_ptr.dtype.element_ty), mask=m)


@triton.jit
def _plain_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr,
                  stride_in, stride_out, stride_t, eps,
                  C: tl.constexpr, BP: tl.constexpr, R: tl.constexpr, SPLIT: tl.constexpr,
                  EXACT: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BP)
    base = t * stride_in
    obase = t * stride_out
    tbase = t * stride_t
    if SPLIT:
        if tl.program_id(1) == 0:
            x = _load(q_ptr, base, i, C)
            _finish(x, qo_ptr, obase, wq_ptr, cos_ptr, sin_ptr, tbase, i, eps, C, R, EXACT)
        else:
            x = _load(k_ptr, base, i, C)
            _finish(x, ko_ptr, obase, wk_ptr, cos_ptr, sin_ptr, tbase, i, eps, C, R, EXACT)
    else:
        xq = _load(q_ptr, base, i, C)
        xk = _load(k_ptr, base, i, C)
        _finish(xq, qo_ptr, obase, wq_ptr, cos_ptr, sin_ptr, tbase, i, eps, C, R, EXACT)
        _finish(xk, ko_ptr, obase, wk_ptr, cos_ptr, sin_ptr, tbase, i, eps, C, R, EXACT)


def main(names, ncu=False):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ncu = ncu or dev == "cpu"  # the CPU (interpreter): a dry run of every case at 3 tokens
    ceil = 4270.0 if ncu else copy_ceiling_gbps()
    print(f"copy ceiling {ceil:.0f} GB/s", flush=True)
    for name in names:
        sh = QK_SHAPES[name] if dev == "cuda" else QK_SHAPES[name].small(3)
        inp = qk_inputs(sh, dev, DTYPE)
        q, k = inp["q"], inp["k"]
        B, S, C = q.shape
        cos, sin = inp["cos"], inp["sin"]
        R = cos.shape[-1]
        qn, kn = inp["q_norm"], inp["k_norm"]
        nbytes = 4 * B * S * C * q.element_size() + 2 * S * R * 4
        qo = torch.empty(B, S, C, device=dev, dtype=q.dtype)
        ko = torch.empty_like(qo)

        def plain(warps, split, exact=False, fusion=True):
            grid = (B * S, 2 if split else 1)
            _plain_kernel[grid](q, k, qo, ko, qn.weight, kn.weight, cos, sin,
                                q.stride(1), qo.stride(1), cos.stride(1), qn.eps,
                                C=C, BP=triton.next_power_of_2(C // 2), R=R, SPLIT=split,
                                EXACT=exact, num_warps=warps, enable_fp_fusion=fusion)

        ref = {}

        def dfuse(tma, flat=True):
            def f():
                Q.USE_TMA, Q.USE_FLAT = tma, flat
                try:
                    return Q.qk_norm_rope(q, k, cos, sin, q_norm=qn, k_norm=kn,
                                          **inp["kwargs"])
                finally:
                    Q.USE_TMA = Q.USE_FLAT = True
            return f

        p = Q.plan(q, k, cos, sin, q_norm=qn, k_norm=kn, **inp["kwargs"])
        H = sh.H

        def flat(warps, split=False, cap=None):
            Q.launch_flat(p, qo.unflatten(2, (H, C // H)), ko.unflatten(2, (H, C // H)),
                          num_warps=warps, split=split, maxnreg=cap)

        rq, rk = dfuse(False, False)()
        ref["q"], ref["k"] = rq.reshape(B, S, C).float(), rk.reshape(B, S, C).float()

        def copy():
            qo.copy_(q)
            ko.copy_(k)

        buf_in = inp["buf"]

        def dfuse_inplace():  # Wan normalises its packed projection in place (the bench does)
            return Q.qk_norm_rope(q, k, cos, sin, q_norm=qn, k_norm=kn, inplace=True,
                                  **inp["kwargs"])

        cases = [("ditfuse per-token", dfuse(False, False), False),
                 ("ditfuse TMA", dfuse(True, False), False),
                 ("ditfuse default", dfuse(True, True), False)]

        if Q.flat_applies(p, p.q, p.k):
            for w, split, cap in FLAT_VARIANTS:
                label = f"flat {w}w" + (" split" if split else "") + (f" cap {cap}" if cap else "")
                cases.append((label, lambda w=w, split=split, cap=cap: flat(w, split, cap), True))
        if "--all" in sys.argv:
            cases.append(("torch copy of q,k", copy, False))
            for w in (4, 8, 16):
                cases.append((f"plain q+k {w} warps", lambda w=w: plain(w, False), True))
            for w in (4, 8):
                cases.append((f"plain split {w} warps", lambda w=w: plain(w, True), True))
        elif C == 5120 and DTYPE == torch.bfloat16:
            cases.append(("plain q+k 8 warps", lambda: plain(8, False), True))
            for w in (4, 8):
                cases.append((f"plain exact {w}w no-fma", lambda w=w: plain(w, False, True, False),
                              True))
        if buf_in is not None:  # last: it rewrites q and k
            cases.append(("ditfuse default in place", dfuse_inplace, False))
        for label, fn, check in cases:
            try:
                if check:
                    qo.fill_(float("nan"))
                    ko.fill_(float("nan"))
                    fn()
                    dq = (qo.float() - ref["q"]).abs().max().item()
                    dk = (ko.float() - ref["k"]).abs().max().item()
                    note = f"max|d| vs ditfuse {max(dq, dk):.3g}"
                else:
                    note = ""
                if ncu:  # under Nsight Compute: two plain launches a case, no timing
                    fn()
                    fn()
                    print(f"{name} {label}: ran {note}", flush=True)
                    continue
                us = graph_us(fn)
            except Exception as e:  # noqa: BLE001
                print(f"{name} {label}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            pct = 100 * nbytes / (us * 1e-6) / 1e9 / ceil
            print(f"{name:14s} {str(DTYPE)[6:]:8s} {label:24s} {us:8.1f} us  {pct:5.1f}% of ceiling  {note}",
                  flush=True)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(args or ["wan14b-480p", "wan14b-720p"], ncu="--ncu" in sys.argv)
