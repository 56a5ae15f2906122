"""Device helpers shared by the QK-norm + RoPE kernels (:mod:`ditfuse.kernels.qk_token`,
:mod:`ditfuse.kernels.qk_flat`) and the attention kernels' prologue: a norm's affine step
and DyT's alpha, the 8-bit quantization of a head, a token's rotary table row, and the
named flags and kind codes these kernels take."""

from __future__ import annotations

from typing import Any, NamedTuple

import triton.language as tl

from ditfuse import norms as _norms
from ditfuse.kernels.element import _e4m3_code, _e4m3_rn, _rnd, _tanh
from ditfuse.runtime.backend import jit

# a norm's kind: the ``NORM`` of the helpers, ``NormFlags.kind`` (values: ditfuse.norms)
NO_NORM = tl.constexpr(_norms.NO_NORM)
RMS = tl.constexpr(_norms.RMS)
LAYER = tl.constexpr(_norms.LAYER)
DYT = tl.constexpr(_norms.DYT)

#: 8-bit output formats, the kernels' ``QUANT`` (NO_QUANT: outputs in the activation dtype)
QUANT_CODE = {"int8": 1, "fp8": 2}
NO_QUANT = tl.constexpr(0)
INT8 = tl.constexpr(QUANT_CODE["int8"])
FP8 = tl.constexpr(QUANT_CODE["fp8"])


class NormFlags(NamedTuple):
    """One norm as a kernel compiles it (``Q_NORM`` / ``K_NORM``: a constexpr)."""

    kind: int = _norms.NO_NORM  # NO_NORM, RMS, LAYER or DYT
    span_all: bool = False  # one statistic across all heads of a token
    has_w: bool = False
    has_b: bool = False
    alpha_ptr: bool = False  # DyT's alpha read from a tensor (else the float argument)
    round_pre_w: bool = False  # rounded to the activation dtype before the weight (and bias)
    w_row: bool = False  # weight / bias one row for every head, read once (word form)
    words: bool = False  # weight / bias read a pair (2i, 2i+1) a 32- / 64-bit word


class RopeFlags(NamedTuple):
    """The rotation as a kernel compiles it (``ROPE``: a constexpr)."""

    on: bool = False
    interleaved: bool = False  # pairs (2i, 2i+1) rather than (i, i + r/2)
    table_half: bool = False  # table width r/2 (one cos / sin a pair) rather than r
    per_head: bool = False  # a table row per head (else one row for every head)
    positions: bool = False  # rows gathered by integer positions
    words: bool = False  # full-width cos / sin read a pair a 32- / 64-bit word
    row: bool = False  # the table row read once for every head (word form)


class NormArgs(NamedTuple):
    """One norm's run-time scalars (``q_args`` / ``k_args``)."""

    alpha: float  # DyT's alpha given as a float
    eps: float
    n: float  # channels one statistic spans (D or H*D)


class Table(NamedTuple):
    """One rotary table's row for a token (:func:`_table_row`): the table, the row's element
    offset, its head stride (0: one row for every head) and its column stride."""

    ptr: Any
    base: Any
    h: Any
    w: Any


class TableRow(NamedTuple):
    """A token's cos and sin rows (:func:`_table_row`), each a :class:`Table`."""

    cos: Table
    sin: Table


class QKTensor(NamedTuple):
    """One of Q / K in a program of the QK kernels (:func:`_qk_tensor`): its input and its
    output (the tensor, the token's element offset, the (b, s, h, d) strides), its norm's
    weight, bias and DyT alpha tensors, and its 8-bit scales' tensor (``QUANT``)."""

    x_ptr: Any
    xbase: Any
    x_strides: Any
    o_ptr: Any
    obase: Any  # 0 until :func:`_out_at`
    o_strides: Any
    w_ptr: Any
    b_ptr: Any
    a_ptr: Any
    sc_ptr: Any


@jit
def _alpha(a_ptr, alpha_val, NORM: tl.constexpr, ALPHA_PTR: tl.constexpr):
    """DyT's alpha from its tensor or its Python float; 0 for the other norms."""
    alpha = 0.0
    if NORM == DYT:
        if ALPHA_PTR:
            alpha = tl.load(a_ptr).to(tl.float32)
        else:
            alpha = alpha_val
    return alpha


@jit
def _norm_affine(
    x,
    w,
    b,
    mean,
    rstd,
    alpha,
    NORM: tl.constexpr,
    ACT: tl.constexpr,
):
    """Normalise one tile with the norm ``NORM`` (:class:`NormFlags`); ``w`` / ``b`` are
    weight and bias tiles of the same layout."""
    if NORM.kind == RMS:
        y = x * rstd
    elif NORM.kind == LAYER:
        y = (x - mean) * rstd
    elif NORM.kind == DYT:
        if NORM.round_pre_w:  # SAME's DynamicTanh in 16 bits rounds alpha * x before the tanh too
            y = _tanh(_rnd(alpha * x, ACT))
        else:
            y = _tanh(alpha * x)
    else:
        y = x
    if NORM.round_pre_w:  # the module's own rounding: from here on in the (half) weight dtype
        y = _rnd(y, ACT)
    if NORM.has_w:
        y = y * w
        if NORM.round_pre_w and NORM.has_b:
            y = _rnd(y, ACT)
    if NORM.has_b:
        y = y + b
    return y


@jit
def _table_row(
    cos_ptr, sin_ptr, pos_ptr, b, s, cos_strides, sin_strides, pos_strides, ROPE: tl.constexpr
):
    """Token (b, s)'s cos and sin rows (gathered by ``positions`` with ``ROPE.positions``)
    as a :class:`TableRow` whose head strides are 0 for a row shared by every head."""
    cbase = 0
    sbase = 0
    if ROPE.on:
        if ROPE.positions:
            row = tl.load(pos_ptr + b * pos_strides[0] + s * pos_strides[1]).to(tl.int64)
        else:
            row = s
        cbase = b * cos_strides[0] + row * cos_strides[1]
        sbase = b * sin_strides[0] + row * sin_strides[1]
    if ROPE.per_head:
        t_ch = cos_strides[2]
        t_sh = sin_strides[2]
    else:  # one row per token, read by every head of Q and K
        t_ch = 0
        t_sh = 0
    return TableRow(
        Table(cos_ptr, cbase, t_ch, cos_strides[3]), Table(sin_ptr, sbase, t_sh, sin_strides[3])
    )


@jit
def _qk_tensor(x_ptr, x_strides, o_ptr, o_strides, w_ptr, b_ptr, a_ptr, sc_ptr, b, s):
    """Q or K of token (b, s) as a :class:`QKTensor`, its output's offset left to
    :func:`_out_at` (computed where the first store wants it: it moves the sm_90 builds)."""
    xbase = b * x_strides[0] + s * x_strides[1]
    return QKTensor(x_ptr, xbase, x_strides, o_ptr, 0, o_strides, w_ptr, b_ptr, a_ptr, sc_ptr)


@jit
def _qk_out(t, obase):
    """:class:`QKTensor` ``t`` with its output's offset ``obase``."""
    return QKTensor(
        t.x_ptr,
        t.xbase,
        t.x_strides,
        t.o_ptr,
        obase,
        t.o_strides,
        t.w_ptr,
        t.b_ptr,
        t.a_ptr,
        t.sc_ptr,
    )


@jit
def _out_at(t, b, s):
    """:class:`QKTensor` ``t`` with its output's offset of token (b, s)."""
    return _qk_out(t, b * t.o_strides[0] + s * t.o_strides[1])


@jit
def _table_head(t, h):
    """Head ``h``'s row of a :class:`Table` (its first column)."""
    return t.ptr + t.base + h * t.h


@jit
def _table_at(t, h, col):
    """Column ``col`` of head ``h``'s row of a :class:`Table`."""
    return _table_head(t, h) + col * t.w


@jit
def _quant_values(y, inv, QUANT: tl.constexpr):
    """``y * inv`` (``inv`` from :func:`_quant_scale`) rounded to the 8-bit format, as an
    int32 that ``_quant_ptr``'s pointer stores: int8 half to even (the value), fp8 e4m3 to
    nearest even (its bit pattern). One multiply a value: an IEEE division a value tripled
    the sm_90 instructions of Wan's flat-row build (docs/design/qk_norm_rope.md).

    int8: adding 1.5 * 2^23 rounds half to even and leaves the integer in the low mantissa
    bits (exact for |t| < 2^22), so one add, an integer subtract and no conversion (F2I runs
    at a quarter of the FP32 rate). No clamp: ``|y| <= amax`` and ``inv <= 127 / amax`` up to
    two roundings, so ``|y * inv| < 127.5``. Rounding in arithmetic rather than by a
    conversion also keeps the bits independent of how one is lowered (Triton's interpreter
    rounds fp32 -> float8e4nv by the first cut-off bit alone) and of whether the GPU converts
    to float8 at all (sm_89+)."""
    t = y * inv
    if QUANT == INT8:
        return (t + 12582912.0).to(tl.int32, bitcast=True) - 0x4B400000
    else:
        return _e4m3_code(_e4m3_rn(t)).to(tl.int32, bitcast=True)


@jit
def _quant_scale(amax, QUANT: tl.constexpr):
    """(scale, inv) of a head whose values reach ``amax``: scale = amax / M, inv = M / amax
    (M = 127 for int8, 448 for fp8; IEEE divisions, one a head; inv capped at the largest
    fp32, which only an amax below 4e-37 reaches); both 1 where amax is 0 (the flat-row
    kernel's store shares it)."""
    if QUANT == INT8:
        M: tl.constexpr = 127.0
    else:
        M: tl.constexpr = 448.0
    zero = amax == 0.0
    scale = tl.where(zero, 1.0, tl.div_rn(amax, M))
    inv = tl.where(zero, 1.0, tl.minimum(tl.div_rn(M, amax), 3.4028234663852886e38))
    # a NaN amax (:func:`_nan_in`): scale and inv NaN, as the reference's; the GPU's minimum
    # returns the operand that is not NaN
    inv = tl.where(amax == amax, inv, amax)
    return scale, inv


@jit
def _nan_in(a, axis: tl.constexpr):
    """0 along ``axis`` where ``a`` holds no NaN, else NaN: added to a head's max of |y| it
    makes the amax NaN where a value is (the max reductions and ``tl.maximum`` drop NaN on
    the GPU; ``reference.quantize_per_token``'s amax keeps it), and leaves a finite amax's
    bits as they are (amax + 0)."""
    # a max of flags, not a sum: the builds' fp32 sums stay those of the 16-bit builds
    return tl.where(tl.max(tl.where(a == a, 0.0, 1.0), axis) > 0.0, float("nan"), 0.0)


@jit
def _same_order(off, VEC: tl.constexpr, ROWS: tl.constexpr = False):
    """An 8-bit store's offsets ``off`` as a value of their own (64-bit: no other access
    shares it), declared contiguous in runs of ``VEC`` only -- the 16-bit store's widest
    vector -- along the channels (the last axis of [heads, channels] tiles with ``ROWS``).
    The coalescing pass gives every memory access of a tile's shape the widest vector any
    of them allows, and with it the tile's register layout, which sets the order of the
    fp32 sums on the GPU. An 8-bit store left at 16 bytes a thread re-lays the loads and
    the sums (sm_90: the flat-row kernel at Wan 14B would hold 8 pairs a thread instead of
    the 16-bit build's 4; the per-token kernel in fp32), and the 8-bit values would quantize
    another rounding of the statistics than the 16-bit call's output
    (tests/test_qk_quantize.py compares the sm_90 builds' layouts)."""
    if ROWS:
        return tl.max_contiguous(off.to(tl.int64), [1, VEC])
    else:
        return tl.max_contiguous(off.to(tl.int64), VEC)


@jit
def _quant_ptr(o_ptr, QUANT: tl.constexpr):
    """Where ``_quant_values`` are stored: the int8 output, or the float8 output's bytes."""
    if QUANT == FP8:
        return o_ptr.to(tl.pointer_type(tl.uint8))
    else:
        return o_ptr
