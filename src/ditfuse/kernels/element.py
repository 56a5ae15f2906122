"""Element helpers shared by every ditfuse kernel: rounding to an activation dtype and to
float8 e4m3 exactly as the GPU does (also under the interpreter), one-instruction exp2 and
reciprocal, and a tanh accurate to a few fp32 ulp."""

from __future__ import annotations

import triton.language as tl

from ditfuse.runtime.backend import INTERPRET, jit

# Triton's interpreter truncates fp32 -> bf16 instead of rounding to nearest even; under
# it, round in integer arithmetic first so the CPU results match the GPU's cvt.rn.bf16.
_SOFT_BF16 = tl.constexpr(INTERPRET)
# Triton's interpreter rounds fp32 -> e4m3 by the first cut-off bit alone (ties away, no
# sticky bits; 31.5 -> 16); under it, round to the e4m3 grid in fp32 arithmetic first (values
# on the grid it converts exactly)
_SOFT_E4M3 = tl.constexpr(INTERPRET)
# inline PTX (single-instruction exp2 / division / conversions) on the GPU; the interpreter
# has none and takes the plain Triton forms
_PTX = tl.constexpr(not INTERPRET)


@jit
def _rnd(x, DT: tl.constexpr):
    """``x`` (fp32) rounded to dtype ``DT`` (round to nearest even), returned as fp32."""
    if _SOFT_BF16 and DT == tl.bfloat16:
        u = x.to(tl.uint32, bitcast=True)
        u = (u + (0x7FFF + ((u >> 16) & 1))) & 0xFFFF0000
        return u.to(tl.float32, bitcast=True)
    else:
        return x.to(DT).to(tl.float32)


@jit
def _cast_out(x, DT: tl.constexpr):
    """``x`` (fp32) cast to the output dtype ``DT``."""
    if _SOFT_BF16 and DT == tl.bfloat16:
        return _rnd(x, DT).to(DT)
    else:
        return x.to(DT)


@jit
def _e4m3_rn(t):
    """fp32 ``t`` (|t| <= 448 up to a rounding) rounded to the nearest float8 e4m3fn value
    (ties to even, saturating at 448), still as fp32 with t's sign (-0.0 kept)."""
    a = tl.minimum(tl.abs(t), 448.0)
    u = a.to(tl.uint32, bitcast=True)
    # normal range (>= 2^-6): keep 3 of fp32's 23 fraction bits, ties to even
    rn = ((u + (0x7FFFF + ((u >> 20) & 1))) & 0xFFF00000).to(tl.float32, bitcast=True)
    # below 2^-6: multiples of 2^-9, the spacing of fp32 at 2^14 (exact, ties to even)
    rs = (a + 16384.0) - 16384.0
    r = tl.where(a < 0.015625, rs, rn).to(tl.uint32, bitcast=True)
    return (r | (t.to(tl.uint32, bitcast=True) & 0x80000000)).to(tl.float32, bitcast=True)


@jit
def _e4m3_code(r):
    """The float8 e4m3fn bit pattern (0..255, uint32) of fp32 ``r``, a value of the e4m3
    grid (``_e4m3_rn``)."""
    u = r.to(tl.uint32, bitcast=True)
    a = u & 0x7FFFFFFF
    af = a.to(tl.float32, bitcast=True)
    normal = (a >> 20) - 960  # exponent and 3 fraction bits, the bias 127 rebased to 7
    sub = (af * 512.0).to(tl.uint32)  # below 2^-6: multiples of 2^-9 (8 -> 2^-6, 0x08)
    return tl.where(af < 0.015625, sub, normal) | ((u >> 24) & 0x80)


@jit
def _cast_e4m3(x):
    """``x`` (fp32) as ``float8_e4m3fn``: round to nearest even, saturating at +-448 (the
    GPU's ``cvt.rn.satfinite``; under the interpreter :func:`_e4m3_rn` first, so that the
    conversion only sees values of the grid)."""
    if _SOFT_E4M3:
        x = _e4m3_rn(x)
    return x.to(tl.float8e4nv)


@jit
def _ex2(x):
    """2^x in fp32. On the GPU one ``ex2.approx.ftz.f32`` whatever Triton's lowering (for
    fp32 ``tl.exp2`` gives the same on sm_90; ``tl.exp`` adds a multiply and ``ex2.approx``'s
    subnormal range handling, three more instructions an element): results below 2^-126
    flush to zero, subnormal inputs count as 0."""
    if _PTX:
        return tl.inline_asm_elementwise(
            "ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return tl.exp2(x)


@jit
def _rcp(x):
    """1 / x in fp32 to 1 ulp for normal x: one ``rcp.approx.ftz.f32`` on the GPU."""
    if _PTX:
        return tl.inline_asm_elementwise(
            "rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return 1.0 / x


@jit
def _tanh(x):
    """tanh in fp32, within 8 ulp (DyT's norm). |x| >= 0.25: (1 - e) / (1 + e) with
    e = 2^(-2 log2(e) |x|) (``tl.exp2``, one ``ex2.approx`` on sm_90: the measured build;
    ``_ex2``'s flush-to-zero form gave 16 more instructions at SAME-L) and the quotient as
    one ``rcp.approx`` of 1 + e, which lies in [1, 2], and a product (Triton's ``/`` adds
    range checks: docs/design/qk_norm_rope.md, v8); below 0.25, where 1 - e would
    cancel, the odd Taylor series up to x^9 in fused multiply-adds (its first omitted term
    is below 2^-27 of tanh there)."""
    ax = tl.abs(x)
    e = tl.exp2(ax * -2.8853900817779268)
    big = (1.0 - e) * _rcp(1.0 + e)
    x2 = x * x
    poly = tl.fma(x2, 62.0 / 2835.0, -17.0 / 315.0)
    poly = tl.fma(poly, x2, 2.0 / 15.0)
    poly = tl.fma(poly, x2, -1.0 / 3.0)
    small = tl.fma(ax * x2, poly, ax)
    t = tl.where(ax < 0.25, small, big)
    return tl.where(x < 0, -t, t)


@jit
def _unpack(u, DT: tl.constexpr):
    """The low and high 16-bit values (dtype ``DT``) of 32-bit words ``u``, as fp32."""
    if DT == tl.bfloat16:
        return (u << 16).to(tl.float32, bitcast=True), (u & 0xFFFF0000).to(tl.float32, bitcast=True)
    else:
        return (u & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32), (u >> 16).to(
            tl.uint16
        ).to(tl.float16, bitcast=True).to(tl.float32)


@jit
def _pack(lo, hi, DT: tl.constexpr):
    """fp32 ``lo``, ``hi`` rounded to ``DT`` (nearest even) as one 32-bit word, lo low."""
    if _PTX:
        if DT == tl.bfloat16:
            CVT: tl.constexpr = "cvt.rn.bf16x2.f32 $0, $2, $1;"
        else:
            CVT: tl.constexpr = "cvt.rn.f16x2.f32 $0, $2, $1;"
        return tl.inline_asm_elementwise(
            CVT, "=r,r,r", [lo, hi], dtype=tl.uint32, is_pure=True, pack=1
        )
    else:
        return _cast_out(lo, DT).to(tl.uint16, bitcast=True).to(tl.uint32) | (
            _cast_out(hi, DT).to(tl.uint16, bitcast=True).to(tl.uint32) << 16
        )
