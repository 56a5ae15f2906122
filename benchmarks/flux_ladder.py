"""The pair form for per-head norms (FLUX, Qwen-Image, HunyuanVideo): a prototype against
ditfuse's per-token kernel (session 14, for the next session's measurement; CUDA-graph us,
L2 flushed as the bench does).

ditfuse's per-token kernel holds a token's heads as [heads, 2 x pairs] tiles and splits
each operand into its (2i, 2i+1) halves with a reshape + split, joining them back for the
store: the same shape of work that cost Wan's flat kernel 83 us of 407 in its channel form
(``benchmarks/wan_ladder.py``, ``NOTES.md`` qk_norm_rope v10). The prototype holds each
head as [heads, pairs] 32-bit words (a bf16 pair a word), the norm weight and the table as
[1, pairs] words broadcast over the heads, with the registry call's arithmetic (RMS per
head, fp32 weight product, one rounding, interleaved RoPE with fp32 tables, no fused
multiply-add). One program a token, Q then K, heads as two power-of-two pieces; the bits
are checked against ditfuse's call before timing.

    python benchmarks/flux_ladder.py [flux1-1024 flux2-1024 qwen-image-1328 ...] [--warps N]
"""
import sys

import torch
import triton
import triton.language as tl

import ditfuse
from ditfuse._runtime import INTERPRET
from ditfuse.shapes import QK_SHAPES
from ditfuse.workloads import qk_inputs

_PTX = tl.constexpr(not INTERPRET)


@triton.jit
def _lo(u):
    return (u << 16).to(tl.float32, bitcast=True)


@triton.jit
def _hi(u):
    return (u & 0xFFFF0000).to(tl.float32, bitcast=True)


@triton.jit
def _pack(lo, hi):
    if _PTX:
        return tl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [lo, hi],
                                         dtype=tl.uint32, is_pure=True, pack=1)
    else:
        return _bits(lo) | (_bits(hi) << 16)


@triton.jit
def _bits(v):  # round to nearest even bf16, as integers (the interpreter's casts truncate)
    u = v.to(tl.uint32, bitcast=True)
    return ((u + (0x7FFF + ((u >> 16) & 1))) >> 16) & 0xFFFF


@triton.jit
def _rnd(v):
    return (_bits(v) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _piece(xu, ou, wu, cu, su, h0, NH: tl.constexpr, P: tl.constexpr, eps):
    hh = h0 + tl.arange(0, NH)[:, None]
    i = tl.arange(0, P)[None, :]
    off = hh * P + i
    u = tl.load(xu + off)
    a = _lo(u)
    b = _hi(u)
    ss = tl.sum(a * a + b * b, 1)[:, None]  # per head
    rstd = 1.0 / tl.sqrt(ss / (2 * P) + eps)
    w = tl.load(wu + i)
    ya = _rnd(a * rstd * _lo(w))
    yb = _rnd(b * rstd * _hi(w))
    c = tl.load(cu + i)  # (cos[2i], cos[2i+1]) of every head: one 64-bit word
    s = tl.load(su + i)
    ca = (c & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True)
    cb = (c >> 32).to(tl.uint32).to(tl.float32, bitcast=True)
    sa = (s & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True)
    sb = (s >> 32).to(tl.uint32).to(tl.float32, bitcast=True)
    tl.store(ou + off, _pack(ya * ca - yb * sa, yb * cb + ya * sb))


@triton.jit
def _pairs_heads_kernel(q_ptr, k_ptr, qo_ptr, ko_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr,
                        stride_qs, stride_ks, eps, D: tl.constexpr, NH0: tl.constexpr,
                        NH1: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    P: tl.constexpr = D // 2
    W = tl.pointer_type(tl.uint32)
    cu = (cos_ptr + t * D).to(tl.pointer_type(tl.uint64))
    su = (sin_ptr + t * D).to(tl.pointer_type(tl.uint64))
    for j in tl.static_range(2):
        if j == 0:
            xu = (q_ptr + t * stride_qs).to(W)
            ou = (qo_ptr + t * stride_qs).to(W)
            wu = qw_ptr.to(W)
        else:
            xu = (k_ptr + t * stride_ks).to(W)
            ou = (ko_ptr + t * stride_ks).to(W)
            wu = kw_ptr.to(W)
        _piece(xu, ou, wu, cu, su, 0, NH0, P, eps)
        if NH1 > 0:
            _piece(xu, ou, wu, cu, su, NH0, NH1, P, eps)


def _pieces(H):
    h0 = 1 << (H.bit_length() - 1)
    return h0, H - h0


def main():
    dev = "cpu" if INTERPRET else "cuda"
    warps = int(sys.argv[sys.argv.index("--warps") + 1]) if "--warps" in sys.argv else 4
    names = [a for a in sys.argv[1:] if a in QK_SHAPES] or ["flux1-1024", "flux2-1024"]
    for name in names:
        sh = QK_SHAPES[name]
        if INTERPRET:
            sh = sh.small(3)
        inp = qk_inputs(sh, dev, torch.bfloat16)
        q, k = inp["q"], inp["k"]
        assert q.dim() == 4 and q.is_contiguous() and k.is_contiguous(), "(B, S, H, D) rows"
        B, S, H, D = q.shape
        h0, h1 = _pieces(H)
        assert h1 & (h1 - 1) == 0, H
        cos = inp["cos"].float().reshape(-1, D).contiguous()  # full width: (cos[2i], cos[2i+1])
        sin = inp["sin"].float().reshape(-1, D).contiguous()
        assert cos.shape[0] == S, "one table row a token"
        kw = dict(inp["kwargs"], q_norm=inp["q_norm"], k_norm=inp["k_norm"])
        qo, ko = torch.empty_like(q), torch.empty_like(k)

        def proto():
            _pairs_heads_kernel[(B * S,)](q, k, qo, ko, inp["q_norm"].weight,
                                          inp["k_norm"].weight, cos, sin, q.stride(1),
                                          k.stride(1), 1e-6, D=D, NH0=h0, NH1=h1,
                                          num_warps=warps, enable_fp_fusion=False)

        def fused():
            return ditfuse.qk_norm_rope(q, k, inp["call_cos"], inp["call_sin"], **kw)

        want = fused()
        proto()
        same = [(a != b).sum().item() for a, b in zip((qo, ko), want)]
        print(f"{name:18s} prototype vs ditfuse: {same} elements differ "
              f"(of {q.numel()} each)", flush=True)
        if INTERPRET:
            continue
        from ditfuse.bench import graph_us
        for tag, f in (("ditfuse", fused), ("pairs", proto)):
            print(f"{name:18s} {tag:8s} {graph_us(f):8.1f} us", flush=True)


if __name__ == "__main__":
    main()
