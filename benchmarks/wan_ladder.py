"""Which part of Wan's QK-norm + RoPE arithmetic costs what (session 14 diagnostic;
CUDA-graph us, L2 flushed as the bench does). A ladder of kernels on the grid and pieces of
ditfuse's flat kernel (a program a (token, Q or K), 2 warps, 5120 = 4096 + 1024 channels),
Q and K separate (1, S, 5120) tensors normalised in place, each stage adding one part:

  0 norm       load, sum of squares (cross-warp), x * rstd, store
  1 +w         * the norm weight (bf16, a value a channel)
  2 +round     the result rounded to bf16 (Wan's RMSNorm output) before RoPE
  3 +rope      the interleaved rotation, cos / sin (fp32, (S, 128)) read a value a channel
  4 +rope-2d   the same arithmetic on [heads, 128] tiles: the table row loaded once a thread
               as a [1, 128] broadcast (8 positions a thread instead of 80 values)
  5 +fma       stage 4 with the sum of squares in fused multiply-adds and the bf16 rounding
               of pairs in one cvt.rn.bf16x2 (stage 4's bits but for the statistic's last
               fp32 bits)

  6 pairs-u32  stage 4's arithmetic with each interleaved pair (2i, 2i+1) of bf16 values
               loaded, held and stored as one 32-bit word: the pair split by a shift and a
               mask, packed back by one cvt.rn.bf16x2.f32 -- no reshape / split / join
  7 pairs+fma  stage 6 with the sum of squares in a fused multiply-add a pair

plus ditfuse's call. No fp contraction (as ditfuse launches). Usage:
    python benchmarks/wan_ladder.py [wan14b-480p ...]
"""
import dataclasses
import sys

import torch
import triton
import triton.language as tl

import ditfuse
from ditfuse._kernel_utils import _rnd
from ditfuse.bench import copy_ceiling_gbps, graph_us
from ditfuse.shapes import QK_SHAPES
from ditfuse.workloads import qk_inputs


@triton.jit
def _rnd_pairs(a, b):
    """(a, b) fp32 rounded to bf16 and back, both in one cvt.rn.bf16x2.f32."""
    return tl.inline_asm_elementwise(
        "{\n\t.reg .b32 t;\n\tcvt.rn.bf16x2.f32 t, $3, $2;\n\tshl.b32 $0, t, 16;"
        "\n\tand.b32 $1, t, -65536;\n\t}", "=r,=r,r,r", [a, b], dtype=(tl.float32, tl.float32),
        is_pure=True, pack=1)


@triton.jit
def _fin1(x, c, yb, wp, cp, sp, rstd, D: tl.constexpr, N: tl.constexpr, STAGE: tl.constexpr):
    y = x.to(tl.float32) * rstd
    if STAGE >= 1:
        y = y * tl.load(wp + c).to(tl.float32)
    if STAGE >= 2:
        y = _rnd(y, tl.bfloat16)
    if STAGE >= 3:
        d = c % D
        ca, cb = tl.split(tl.reshape(tl.load(cp + d), (N // 2, 2)))
        sa, sb = tl.split(tl.reshape(tl.load(sp + d), (N // 2, 2)))
        ya, yb2 = tl.split(tl.reshape(y, (N // 2, 2)))
        y = tl.reshape(tl.join(ya * ca - yb2 * sa, yb2 * cb + ya * sb), (N,))
    tl.store(yb + c, y.to(tl.bfloat16))


@triton.jit
def _fin2(x, c, yb, wp, cp, sp, rstd, D: tl.constexpr, R: tl.constexpr, STAGE: tl.constexpr):
    y = x.to(tl.float32) * rstd * tl.load(wp + c).to(tl.float32)
    d = tl.arange(0, D)[None, :]
    ca, cb = tl.split(tl.reshape(tl.load(cp + d), (1, D // 2, 2)))
    sa, sb = tl.split(tl.reshape(tl.load(sp + d), (1, D // 2, 2)))
    ya, yb2 = tl.split(tl.reshape(y, (R, D // 2, 2)))
    if STAGE >= 5:
        ya, yb2 = _rnd_pairs(ya, yb2)
    else:
        ya = _rnd(ya, tl.bfloat16)
        yb2 = _rnd(yb2, tl.bfloat16)
    y = tl.reshape(tl.join(ya * ca - yb2 * sa, yb2 * cb + ya * sb), (R, D))
    tl.store(yb + c, y.to(tl.bfloat16))


@triton.jit
def _lo(u):
    return (u << 16).to(tl.float32, bitcast=True)


@triton.jit
def _hi(u):
    return (u & 0xFFFF0000).to(tl.float32, bitcast=True)


@triton.jit
def _pack(lo, hi):
    """bf16(lo) | bf16(hi) << 16, rounded to nearest even, one instruction."""
    return tl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,r,r", [lo, hi],
                                     dtype=tl.uint32, is_pure=True, pack=1)


@triton.jit
def _fin_pairs(u, p, xu, wu, cp, sp, rstd, D: tl.constexpr):
    w = tl.load(wu + p)
    ylo = _lo(u) * rstd * _lo(w)
    yhi = _hi(u) * rstd * _hi(w)
    r = _pack(ylo, yhi)  # Wan's RMSNorm output, rounded to bf16
    ylo = _lo(r)
    yhi = _hi(r)
    d = 2 * (p % (D // 2))  # the pair's first column: Wan's cos[2i] and sin[2i + 1] serve both
    c = tl.load(cp + d)
    s = tl.load(sp + d)
    tl.store(xu + p, _pack(ylo * c - yhi * s, yhi * c + ylo * s))


@triton.jit
def _pairs_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, S, eps, HD,
                  D: tl.constexpr, N0: tl.constexpr, N1: tl.constexpr, FMA: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1).to(tl.int64)
    xu = (x_ptr + (j * S + t) * HD).to(tl.pointer_type(tl.uint32))
    wu = (w_ptr + j * HD).to(tl.pointer_type(tl.uint32))
    cp = cos_ptr + t * D
    sp = sin_ptr + t * D
    p0 = tl.arange(0, N0 // 2)
    p1 = N0 // 2 + tl.arange(0, N1 // 2)
    a = tl.load(xu + p0)
    b = tl.load(xu + p1)
    if FMA:
        ss = tl.sum(tl.fma(_lo(a), _lo(a), _hi(a) * _hi(a))) + \
            tl.sum(tl.fma(_lo(b), _lo(b), _hi(b) * _hi(b)))
    else:
        ss = tl.sum(_lo(a) * _lo(a) + _hi(a) * _hi(a)) + tl.sum(_lo(b) * _lo(b) + _hi(b) * _hi(b))
    rstd = 1.0 / tl.sqrt(ss / (N0 + N1) + eps)
    _fin_pairs(a, p0, xu, wu, cp, sp, rstd, D)
    _fin_pairs(b, p1, xu, wu, cp, sp, rstd, D)


@triton.jit
def _ladder_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, S, eps, HD,
                   D: tl.constexpr, N0: tl.constexpr, N1: tl.constexpr, STAGE: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1).to(tl.int64)
    xb = x_ptr + (j * S + t) * HD
    cp = cos_ptr + t * D
    sp = sin_ptr + t * D
    wp = w_ptr + j * HD
    if STAGE <= 3:
        c0 = tl.arange(0, N0)
        c1 = N0 + tl.arange(0, N1)
    else:
        c0 = tl.arange(0, N0 // D)[:, None] * D + tl.arange(0, D)[None, :]
        c1 = N0 + tl.arange(0, N1 // D)[:, None] * D + tl.arange(0, D)[None, :]
    a = tl.load(xb + c0)
    b = tl.load(xb + c1)
    af = a.to(tl.float32)
    bf = b.to(tl.float32)
    if STAGE >= 5:
        a2 = tl.reshape(af, (N0 // 2, 2))
        b2 = tl.reshape(bf, (N1 // 2, 2))
        a0, a1 = tl.split(a2)
        b0, b1 = tl.split(b2)
        ss = tl.sum(tl.fma(a0, a0, a1 * a1)) + tl.sum(tl.fma(b0, b0, b1 * b1))
    else:
        ss = tl.sum(af * af) + tl.sum(bf * bf)
    rstd = 1.0 / tl.sqrt(ss / (N0 + N1) + eps)
    if STAGE <= 3:
        _fin1(a, c0, xb, wp, cp, sp, rstd, D, N0, STAGE)
        _fin1(b, c1, xb, wp, cp, sp, rstd, D, N1, STAGE)
    else:
        _fin2(a, c0, xb, wp, cp, sp, rstd, D, N0 // D, STAGE)
        _fin2(b, c1, xb, wp, cp, sp, rstd, D, N1 // D, STAGE)


def main():
    names = [a for a in sys.argv[1:] if a in QK_SHAPES] or ["wan14b-480p"]
    ceiling = copy_ceiling_gbps()
    print(f"copy ceiling {ceiling:.0f} GB/s", flush=True)
    for name in names:
        sh = dataclasses.replace(QK_SHAPES[name], packed=0)
        inp = qk_inputs(sh, "cuda", torch.bfloat16)
        q, k = inp["q"], inp["k"]
        S, HD, D = sh.S, sh.H * sh.D, sh.D
        nbytes = 4 * S * HD * 2
        x = torch.stack([q[0], k[0]])  # (2, S, HD): Q rows, then K rows
        w = torch.stack([inp["q_norm"].weight, inp["k_norm"].weight])
        cos = torch.randn(S, D, device="cuda")
        sin = torch.randn(S, D, device="cuda")
        N0 = 1 << (HD.bit_length() - 1)
        N1 = HD - N0
        for st, tag in enumerate(["norm", "+w", "+round", "+rope", "+rope-2d", "+fma"]):
            f = lambda st=st: _ladder_kernel[(S, 2)](x, w, cos, sin, S, 1e-6, HD, D=D, N0=N0,
                                                     N1=N1, STAGE=st, num_warps=2,
                                                     enable_fp_fusion=False)
            us = graph_us(f)
            print(f"{name:14s} {st} {tag:10s} {us:8.1f} us {nbytes / us / 1e3 / ceiling * 100:6.1f}%",
                  flush=True)
        for st, tag in ((6, "pairs-u32"), (7, "pairs+fma")):
            f = lambda st=st: _pairs_kernel[(S, 2)](x, w, cos, sin, S, 1e-6, HD, D=D, N0=N0,
                                                    N1=N1, FMA=st == 7, num_warps=2,
                                                    enable_fp_fusion=False)
            us = graph_us(f)
            print(f"{name:14s} {st} {tag:10s} {us:8.1f} us {nbytes / us / 1e3 / ceiling * 100:6.1f}%",
                  flush=True)
        kw = dict(inp["kwargs"], q_norm=inp["q_norm"], k_norm=inp["k_norm"])
        us = graph_us(lambda: ditfuse.qk_norm_rope(q, k, inp["call_cos"], inp["call_sin"],
                                                   inplace=True, **kw))
        print(f"{name:14s} - ditfuse    {us:8.1f} us {nbytes / us / 1e3 / ceiling * 100:6.1f}%",
              flush=True)


if __name__ == "__main__":
    main()
