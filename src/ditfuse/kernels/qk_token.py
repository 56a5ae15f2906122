"""The per-token Triton kernel of the fused QK-norm + RoPE (private; launched by
:mod:`ditfuse.ops.qk_norm_rope` wherever the flat-row kernel of :mod:`ditfuse.kernels.qk_flat`
does not apply).

One program handles one token and a group of heads of it, for Q and then K:

    load (one read) -> norm statistics (fp32) -> normalise, weight, bias -> [round to the
    activation dtype] -> rotate with the token's cos/sin row -> cast -> store (one write)

The token's cos/sin row is shared by every head (unless the table is per head) and loaded
where the rotation needs it, once per tensor (K's load hits L1): held from the start it
would cost registers for the whole program. Offsets within a token are 32-bit, added to the
token's 64-bit base (``OFF64`` when a head stride makes them reach 2^31). A group of heads
is held as at most two power-of-two pieces (40 = 32 + 8, 24 = 16 + 8, 48 = 32 + 16) so
that no lanes are wasted on padding heads. A rotary pair is (a, b): interleaved
(2i, 2i+1), loaded as one contiguous row and split in registers -- or, for aligned 16-bit
rows (the word form, ``X_WORDS``), each pair loaded and stored as one 32-bit word, with
the rows every head shares (per-head weights, a shared table) loaded once and broadcast --
or rotate-half (i, i + r/2), loaded as two contiguous halves; channels past the rotary
width pass through the norm only.

A tensor travels with its strides as one tuple (``q_strides`` = (b, s, h, d)); a norm's
compile-time description is a :class:`~ditfuse.kernels.common.NormFlags`, the rotation's a
:class:`~ditfuse.kernels.common.RopeFlags`, a norm's run-time scalars a
:class:`~ditfuse.kernels.common.NormArgs`. Q and K reach the helpers as
:class:`~ditfuse.kernels.common.QKTensor` (one code path for both), the kernel's other
constexprs as one :class:`TokenForm` (``FORM``), the program's token and heads as a
:class:`TokenHeads`.

Floating-point contraction is switched off at launch (``enable_fp_fusion=False``) so the
rotation rounds exactly as eager PyTorch does: round(round(a*c) - round(b*s)).

With ``QUANT`` (``INT8`` or ``FP8``) the outputs are 8-bit: each head's values, rounded to
the activation dtype as the 16-bit store would round them, share one fp32 scale (their amax
over 127 or 448), stored per (batch, head, token), and are multiplied by its reciprocal
(one IEEE division a head, not a value). A token's heads are in the program already, so
the amax costs no extra pass (docs/qk_norm_rope.md, "8-bit output"); the 8-bit stores are
vectorised no wider than the 16-bit ones (``_same_order``), so that on the GPU the fp32
sums keep the 16-bit build's register layout, and their order.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import triton
import triton.language as tl

from ditfuse.kernels.common import (
    LAYER,
    NO_QUANT,
    RMS,
    NormArgs,
    RopeFlags,
    _alpha,
    _nan_in,
    _norm_affine,
    _out_at,
    _qk_out,
    _qk_tensor,
    _quant_ptr,
    _quant_scale,
    _quant_values,
    _same_order,
    _table_row,
)
from ditfuse.kernels.element import _cast_out, _pack, _rnd, _unpack
from ditfuse.runtime.backend import jit


class TokenTile(NamedTuple):
    """How a program of the per-token kernel holds its heads (``TILE``: a constexpr)."""

    heads: int  # heads of a token a program
    piece0: int  # the heads as two power-of-two pieces (piece1 may be 0)
    piece1: int
    half_pad: int  # rotary pairs a head (rotary_dim / 2), padded to a power of two
    pass_pad: int  # pass-through channels a head (head_dim - rotary_dim), likewise


class TokenForm(NamedTuple):
    """How a program of the per-token kernel holds its token (``FORM``: constexpr fields)."""

    d: int  # head_dim
    r2: int  # rotary_dim // 2 (0 without RoPE); d - 2 * r2 pass through
    tile: TokenTile
    rope: RopeFlags
    round_norm: bool  # round to the activation dtype between norm and rotation
    stats: int  # 0, STATS_STORE or STATS_LOAD (head-parallel passes)
    off64: bool  # offsets within a token need 64 bits (huge head strides)
    x_words: bool  # interleaved 16-bit Q / K rows read and written a pair a word
    quant: int  # NO_QUANT, INT8 or FP8


class HeadRows(NamedTuple):
    """Where a piece's heads lie in one tensor (``rows`` of ``_load_pairs`` / ``_store_pairs``
    / ``_load_pass``): the tensor, the element offset of the program's first head, the heads
    ``hh`` ([NH, 1], counted from that head) and their mask, the head and channel strides."""

    ptr: Any
    base: Any
    hh: Any
    hmask: Any
    stride_h: Any
    stride_d: Any


class TokenHeads(NamedTuple):
    """A program's token and heads as the per-token helpers read them (``th``)."""

    tok: Any  # the token, b * S + s
    h_start: Any  # the program's heads: h_start .. h_end - 1
    h_end: Any
    row: Any  # the token's TableRow
    scbase: Any  # the 8-bit scales' element offset (of the program's first head once
    # _norm_rope_tensor has it) and their (b, h, s) strides
    sc_strides: Any


# ``STATS``, the head-parallel passes of a norm across heads split over ranks (0: neither)
STATS_STORE = tl.constexpr(1)  # pass 1: store this rank's per-token sums of squares only
STATS_LOAD = tl.constexpr(2)  # pass 2: normalise with the all-reduced sums


@jit
def _load_words(ptr, i, m):
    """Values (2i, 2i+1) after ``ptr`` as fp32 tiles (a, b): one 32-bit load a pair for
    16-bit values, one 64-bit load for fp32 (``ptr`` aligned to a pair, unit stride)."""
    DT: tl.constexpr = ptr.dtype.element_ty
    if DT.primitive_bitwidth == 16:
        return _unpack(tl.load(ptr.to(tl.pointer_type(tl.uint32)) + i, mask=m, other=0), DT)
    else:
        u = tl.load(ptr.to(tl.pointer_type(tl.uint64)) + i, mask=m, other=0)
        return (u & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True), (u >> 32).to(
            tl.uint32
        ).to(tl.float32, bitcast=True)


@jit
def _load_row_pairs(
    rows,
    R2: tl.constexpr,
    HALF_PAD: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    DUP: tl.constexpr,
    WORDS: tl.constexpr,
):
    """``_load_pairs`` of one row shared by every head, as [1, HALF_PAD] tiles (interleaved
    pairs or a half-width table: the word form's operands; ``rows``' heads unused)."""
    tl.static_assert(INTERLEAVED)
    ptr, base, _, _, _, stride_d = rows
    i = tl.arange(0, HALF_PAD)[None, :]
    m = i < R2
    if INTERLEAVED and not DUP and WORDS:
        xa, xb = _load_words(ptr + base, i, m)
    elif INTERLEAVED and not DUP:
        j = tl.arange(0, 2 * HALF_PAD)[None, :]
        x = tl.load(ptr + base + j * stride_d, mask=j < 2 * R2, other=0.0).to(tl.float32)
        xa, xb = tl.split(tl.reshape(x, (1, HALF_PAD, 2)))
    else:
        xa = tl.load(ptr + base + i * stride_d, mask=m, other=0.0).to(tl.float32)
        xb = xa
    return xa, xb


@jit
def _load_pairs(
    rows,
    R2: tl.constexpr,
    HALF_PAD: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    DUP: tl.constexpr,
    WORDS: tl.constexpr = False,
    ROW: tl.constexpr = False,
):
    """Rotary channels of the NH heads of ``rows`` (:class:`HeadRows`) as (a, b) fp32 tiles
    of shape [NH, HALF_PAD].

    Every operand of the rotation (x, weights, bias, cos, sin) is loaded through this one
    function with pointers of the same [NH, ...] shape, so all of them land in the same
    register layout and the arithmetic needs no layout conversion (a row shared by all
    heads has head stride 0 and is re-read from L1). ``DUP``: the source holds one value
    per pair (a half-width table), given to both a and b. ``WORDS`` (interleaved, unit
    channel stride, every head's row aligned to a pair): each pair read as one word and
    split by shifts -- no [NH, HALF_PAD, 2] reshape and split of a channel tile. ``ROW``:
    one row shared by every head (weights of a per-head norm, a table shared by the heads),
    loaded once as [1, HALF_PAD] tiles that the arithmetic broadcasts over the heads.
    """
    ptr, base, hh, hmask, stride_h, stride_d = rows
    NH: tl.constexpr = hh.shape[0]
    if ROW:
        xa, xb = _load_row_pairs(rows, R2, HALF_PAD, INTERLEAVED, DUP, WORDS)
    elif INTERLEAVED and not DUP and WORDS:
        i = tl.arange(0, HALF_PAD)[None, :]
        xa, xb = _load_words(ptr + base + hh * stride_h, i, hmask & (i < R2))
    elif INTERLEAVED and not DUP:
        j = tl.arange(0, 2 * HALF_PAD)[None, :]
        m = hmask & (j < 2 * R2)
        x = tl.load(ptr + base + hh * stride_h + j * stride_d, mask=m, other=0.0).to(tl.float32)
        xa, xb = tl.split(tl.reshape(x, (NH, HALF_PAD, 2)))
    elif DUP:
        # one value a pair, in either rotary style: one [NH, HALF_PAD] load used for both a
        # and b (a per-channel load of duplicated addresses split in registers held twice
        # the values: 127 instead of 64 registers at Qwen-Image's 24 x 128 on sm_90)
        i = tl.arange(0, HALF_PAD)[None, :]
        m = hmask & (i < R2)
        xa = tl.load(ptr + base + hh * stride_h + i * stride_d, mask=m, other=0.0).to(tl.float32)
        xb = xa
    else:
        i = tl.arange(0, HALF_PAD)[None, :]
        m = hmask & (i < R2)
        p = ptr + base + hh * stride_h + i * stride_d
        xa = tl.load(p, mask=m, other=0.0).to(tl.float32)
        xb = tl.load(p + R2 * stride_d, mask=m, other=0.0).to(tl.float32)
    return xa, xb


@jit
def _store_pairs(
    rows,
    ya,
    yb,
    R2: tl.constexpr,
    HALF_PAD: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    WORDS: tl.constexpr = False,
    VEC: tl.constexpr = 0,
):
    """Store the (a, b) tiles of the heads of ``rows`` (:class:`HeadRows`), the inverse of
    ``_load_pairs``. ``VEC`` (the 8-bit store): offsets declared contiguous in runs of VEC
    only (``_same_order``)."""
    ptr, base, hh, hmask, stride_h, stride_d = rows
    NH: tl.constexpr = hh.shape[0]
    if INTERLEAVED and WORDS:  # 16-bit: a pair a 32-bit word, rounded by one conversion
        i = tl.arange(0, HALF_PAD)[None, :]
        wp = (ptr + base + hh * stride_h).to(tl.pointer_type(tl.uint32)) + i
        tl.store(wp, _pack(ya, yb, ptr.dtype.element_ty), mask=hmask & (i < R2))
    elif INTERLEAVED:
        j = tl.arange(0, 2 * HALF_PAD)[None, :]
        m = hmask & (j < 2 * R2)
        y = tl.reshape(tl.join(ya, yb), (NH, 2 * HALF_PAD))
        if VEC > 0:
            p = ptr + base + _same_order(hh * stride_h + j * stride_d, VEC, True)
        else:
            p = ptr + base + hh * stride_h + j * stride_d
        tl.store(p, _cast_out(y, ptr.dtype.element_ty), mask=m)
    else:
        i = tl.arange(0, HALF_PAD)[None, :]
        m = hmask & (i < R2)
        if VEC > 0:
            p = ptr + base + _same_order(hh * stride_h + i * stride_d, VEC, True)
        else:
            p = ptr + base + hh * stride_h + i * stride_d
        tl.store(p, _cast_out(ya, ptr.dtype.element_ty), mask=m)
        tl.store(p + R2 * stride_d, _cast_out(yb, ptr.dtype.element_ty), mask=m)


@jit
def _load_table(
    t, h_start, hh, hmask, R2: tl.constexpr, HALF_PAD: tl.constexpr, ROPE: tl.constexpr
):
    """A and b channel of each pair of one :class:`~ditfuse.kernels.common.Table` (cos or
    sin), fp32 [NH, HALF_PAD] tiles, for the program's heads from ``h_start``."""
    return _load_pairs(
        HeadRows(t.ptr, t.base + h_start * t.h, hh, hmask, t.h, t.w),
        R2=R2,
        HALF_PAD=HALF_PAD,
        INTERLEAVED=ROPE.interleaved,
        DUP=ROPE.table_half,
        WORDS=ROPE.words,
        ROW=ROPE.row,
    )


@jit
def _load_rope_tables(
    row,
    h_start,
    hh,
    hmask,
    R2: tl.constexpr,
    HALF_PAD: tl.constexpr,
    ROPE: tl.constexpr,
):
    """cos/sin of the a and b channel of each pair, fp32 [NH, HALF_PAD] tiles, for the
    program's heads from ``h_start`` (``row``: the token's :class:`TableRow`). A table shared
    by all heads has head stride 0: every head reads the same row (from L1)."""
    ca, cb = _load_table(row.cos, h_start, hh, hmask, R2=R2, HALF_PAD=HALF_PAD, ROPE=ROPE)
    sa, sb = _load_table(row.sin, h_start, hh, hmask, R2=R2, HALF_PAD=HALF_PAD, ROPE=ROPE)
    return ca, cb, sa, sb


@jit
def _piece_sums(xa, xb, xp, ma, mp, mean, SPAN_ALL: tl.constexpr, CENTER: tl.constexpr):
    """Sum (or sum of squares about ``mean``) per head [NH, 1], or over the piece (scalar)."""
    if CENTER:
        xa = tl.where(ma, xa - mean, 0.0)
        xb = tl.where(ma, xb - mean, 0.0)
        xp = tl.where(mp, xp - mean, 0.0)
    sq = tl.sum(xa * xa, 1) + tl.sum(xb * xb, 1) + tl.sum(xp * xp, 1)
    if SPAN_ALL:
        return tl.sum(sq, 0)
    else:
        return sq[:, None]


@jit
def _piece_plain_sums(xa, xb, xp, SPAN_ALL: tl.constexpr):
    s = tl.sum(xa, 1) + tl.sum(xb, 1) + tl.sum(xp, 1)
    if SPAN_ALL:
        return tl.sum(s, 0)
    else:
        return s[:, None]


@jit
def _quantize_store(oa, ob, yp, ma, mp, hh, hmask, t, th, FORM: tl.constexpr):
    """Quantize each head of a piece to 8 bits with one fp32 scale a head (``FORM.quant``):
    the values are the ones the 16-bit path stores (rounded to the activation dtype), the
    amax spans the head's rotary pairs and pass-through channels (docs/qk_norm_rope.md,
    "8-bit output")."""
    ACT: tl.constexpr = t.x_ptr.dtype.element_ty
    QUANT: tl.constexpr = FORM.quant
    R2: tl.constexpr = FORM.r2
    P: tl.constexpr = FORM.d - 2 * R2
    if ACT != tl.float32:
        oa = _rnd(oa, ACT)
        ob = _rnd(ob, ACT)
        if P > 0:
            yp = _rnd(yp, ACT)
    xa = tl.where(ma, tl.abs(oa), 0.0)
    xb = tl.where(ma, tl.abs(ob), 0.0)
    amax = tl.maximum(tl.max(xa, 1), tl.max(xb, 1))
    nan = _nan_in(xa, 1) + _nan_in(xb, 1)
    if P > 0:
        xp = tl.where(mp, tl.abs(yp), 0.0)
        amax = tl.maximum(amax, tl.max(xp, 1))
        nan += _nan_in(xp, 1)
    amax += nan  # a NaN in the head: a NaN scale
    scale, inv = _quant_scale(amax[:, None], QUANT)
    tl.store(t.sc_ptr + th.scbase + hh.to(tl.int64) * th.sc_strides[1], scale, mask=hmask)
    qo_ptr = _quant_ptr(t.o_ptr, QUANT)
    # vectorised no wider than the 16-bit stores (128 bits of ACT a thread): _same_order
    VEC: tl.constexpr = 128 // ACT.primitive_bitwidth
    stride_oh = t.o_strides[2]
    stride_od = t.o_strides[3]
    _store_pairs(
        HeadRows(qo_ptr, t.obase, hh, hmask, stride_oh, stride_od),
        _quant_values(oa, inv, QUANT),
        _quant_values(ob, inv, QUANT),
        R2=R2,
        HALF_PAD=FORM.tile.half_pad,
        INTERLEAVED=FORM.rope.interleaved,
        WORDS=False,
        VEC=VEC,
    )
    if P > 0:
        jp = tl.arange(0, FORM.tile.pass_pad)[None, :]
        tl.store(
            qo_ptr + t.obase + _same_order(hh * stride_oh + (2 * R2 + jp) * stride_od, VEC, True),
            _cast_out(_quant_values(yp, inv, QUANT), qo_ptr.dtype.element_ty),
            mask=mp,
        )


@jit
def _load_norm_pairs(ptr, base, hh, hmask, stride_h, NORM: tl.constexpr, FORM: tl.constexpr):
    """A norm's weight or bias of the rotary channels as (a, b) fp32 tiles (``_load_pairs``;
    one row for every head with ``NORM.w_row``)."""
    return _load_pairs(
        HeadRows(ptr, base, hh, hmask, stride_h, 1),
        R2=FORM.r2,
        HALF_PAD=FORM.tile.half_pad,
        INTERLEAVED=FORM.rope.interleaved,
        DUP=False,
        WORDS=NORM.words,
        ROW=NORM.w_row,
    )


@jit
def _finish_piece(
    x, mp, mean, rstd, alpha, hh, hmask, t, th, NORM: tl.constexpr, FORM: tl.constexpr
):
    """Weight, bias, rotate and store the heads ``hh`` of one piece (``x``: its rotary pairs
    (a, b) and its pass-through channels) with their statistics."""
    xa, xb, xp = x
    ACT: tl.constexpr = t.x_ptr.dtype.element_ty
    D: tl.constexpr = FORM.d
    R2: tl.constexpr = FORM.r2
    HALF_PAD: tl.constexpr = FORM.tile.half_pad
    ROPE: tl.constexpr = FORM.rope
    P: tl.constexpr = D - 2 * R2
    h_start = th.h_start
    # weight/bias: per head (same D channels for every head: head stride 0, L1 hits) or
    # across heads (channel h * D + d)
    if NORM.span_all:
        w_sh = D
    else:
        w_sh = 0
    wa = 1.0
    wb = 1.0
    ba = 0.0
    bb = 0.0
    if NORM.has_w:
        wa, wb = _load_norm_pairs(t.w_ptr, h_start * w_sh, hh, hmask, w_sh, NORM=NORM, FORM=FORM)
    if NORM.has_b:
        ba, bb = _load_norm_pairs(t.b_ptr, h_start * w_sh, hh, hmask, w_sh, NORM=NORM, FORM=FORM)
    ya = _norm_affine(xa, wa, ba, mean, rstd, alpha, NORM=NORM, ACT=ACT)
    yb = _norm_affine(xb, wb, bb, mean, rstd, alpha, NORM=NORM, ACT=ACT)
    if FORM.round_norm:  # where diffusers' eager code rounds: between the norm and the rotation
        ya = _rnd(ya, ACT)
        yb = _rnd(yb, ACT)
    if ROPE.on:
        # the token's table row, loaded here rather than with x: it is live only for the
        # rotation (the second tensor's load hits L1), which keeps the registers of a
        # whole-token program low enough for more programs per SM
        ca, cb, sa, sb = _load_rope_tables(
            th.row, h_start, hh, hmask, R2=R2, HALF_PAD=HALF_PAD, ROPE=ROPE
        )
        oa = ya * ca - yb * sa
        ob = yb * cb + ya * sb
    else:
        oa = ya
        ob = yb
    stride_oh = t.o_strides[2]
    stride_od = t.o_strides[3]
    if FORM.quant == NO_QUANT:
        rows = HeadRows(t.o_ptr, t.obase, hh, hmask, stride_oh, stride_od)
        _store_pairs(rows, oa, ob, R2, HALF_PAD, ROPE.interleaved, WORDS=FORM.x_words)
    yp = 0.0
    if P > 0:
        jp = tl.arange(0, FORM.tile.pass_pad)[None, :]
        wp = 1.0
        bp = 0.0
        if NORM.has_w:
            wp = tl.load(t.w_ptr + h_start * w_sh + hh * w_sh + 2 * R2 + jp, mask=mp, other=0.0).to(
                tl.float32
            )
        if NORM.has_b:
            bp = tl.load(t.b_ptr + h_start * w_sh + hh * w_sh + 2 * R2 + jp, mask=mp, other=0.0).to(
                tl.float32
            )
        yp = _norm_affine(xp, wp, bp, mean, rstd, alpha, NORM=NORM, ACT=ACT)
        if FORM.quant == NO_QUANT:
            tl.store(
                t.o_ptr + t.obase + hh * stride_oh + (2 * R2 + jp) * stride_od,
                _cast_out(yp, t.o_ptr.dtype.element_ty),
                mask=mp,
            )
    if FORM.quant != NO_QUANT:
        # the head's scale needs all of its channels: the rotary pairs are stored with the
        # pass-through ones, after the amax (one pass, the head's values in registers)
        ma = hmask & (tl.arange(0, HALF_PAD)[None, :] < R2)
        _quantize_store(oa, ob, yp, ma, mp, hh, hmask, t, th, FORM=FORM)


@jit
def _local_heads(h_start, h_end, FIRST: tl.constexpr, NH: tl.constexpr, OFF64: tl.constexpr):
    """Head indices of one piece relative to the program's first head, [NH, 1], and their
    mask. Offsets within a token are 32-bit (one multiply per element instead of a 64-bit
    one; the launcher checks they fit) and added to the token's 64-bit base, unless OFF64."""
    hl = FIRST + tl.arange(0, NH)[:, None]
    if OFF64:
        hl = hl.to(tl.int64)
    return hl, hl < (h_end - h_start).to(tl.int32)


@jit
def _load_pass(rows, R2: tl.constexpr, P: tl.constexpr, PASS_PAD: tl.constexpr):
    """The pass-through channels (from 2 * R2) of the heads of ``rows`` (:class:`HeadRows`)
    as an fp32 tile, and its mask."""
    ptr, base, hh, hmask, stride_h, stride_d = rows
    jp = tl.arange(0, PASS_PAD)[None, :]
    mp = hmask & (jp < P)
    xp = tl.load(ptr + base + hh * stride_h + (2 * R2 + jp) * stride_d, mask=mp, other=0.0).to(
        tl.float32
    )
    return xp, mp


@jit
def _load_piece(t, xbase, hh, hmask, FORM: tl.constexpr):
    """The rotary pairs (a, b) and the pass-through channels of the heads ``hh`` of ``t``'s
    input, as fp32 tiles."""
    R2: tl.constexpr = FORM.r2
    rows = HeadRows(t.x_ptr, xbase, hh, hmask, t.x_strides[2], t.x_strides[3])
    xa, xb = _load_pairs(
        rows,
        R2=R2,
        HALF_PAD=FORM.tile.half_pad,
        INTERLEAVED=FORM.rope.interleaved,
        DUP=False,
        WORDS=FORM.x_words,
    )
    P: tl.constexpr = FORM.d - 2 * R2
    xp, mp = _load_pass(rows, R2=R2, P=P, PASS_PAD=FORM.tile.pass_pad)
    return xa, xb, xp


@jit
def _load_tensor(t, th, FORM: tl.constexpr):
    """All of one tensor's channels for the program's heads, as fp32 tiles: (a, b, pass)
    of piece 0, then of piece 1 (0.0 where it has none)."""
    P0: tl.constexpr = FORM.tile.piece0
    P1: tl.constexpr = FORM.tile.piece1
    xbase = t.xbase + th.h_start * t.x_strides[2]
    hh0, hm0 = _local_heads(th.h_start, th.h_end, 0, P0, FORM.off64)
    xa0, xb0, xp0 = _load_piece(t, xbase, hh0, hm0, FORM=FORM)
    xa1 = 0.0
    xb1 = 0.0
    xp1 = 0.0
    if P1 > 0:
        hh1, hm1 = _local_heads(th.h_start, th.h_end, P0, P1, FORM.off64)
        xa1, xb1, xp1 = _load_piece(t, xbase, hh1, hm1, FORM=FORM)
    return xa0, xb0, xp0, xa1, xb1, xp1


@jit
def _norm_stats(
    x, masks, a_ptr, args, stats_ptr, tok, P1: tl.constexpr, NORM: tl.constexpr, STATS: tl.constexpr
):
    """fp32 (mean, rstd) of each piece of ``x`` (``_load_tensor``'s tiles; shared when the
    norm spans all heads) and the DyT alpha: what ``_norm_affine`` needs. ``masks``: the
    (pairs, pass-through) masks of piece 0 and piece 1."""
    xa0, xb0, xp0, xa1, xb1, xp1 = x
    ma0, mp0, ma1, mp1 = masks
    mean0 = 0.0
    mean1 = 0.0
    rstd0 = 1.0
    rstd1 = 1.0
    alpha = _alpha(a_ptr, args.alpha, NORM.kind, NORM.alpha_ptr)
    if NORM.kind == LAYER:
        s0 = _piece_plain_sums(xa0, xb0, xp0, NORM.span_all)
        if P1 > 0:
            s1 = _piece_plain_sums(xa1, xb1, xp1, NORM.span_all)
            if NORM.span_all:
                s0 = s0 + s1
        mean0 = s0 / args.n
        if P1 > 0:
            if NORM.span_all:
                mean1 = mean0
            else:
                mean1 = s1 / args.n
    if NORM.kind == RMS or NORM.kind == LAYER:
        q0 = _piece_sums(xa0, xb0, xp0, ma0, mp0, mean0, NORM.span_all, NORM.kind == LAYER)
        if P1 > 0:
            q1 = _piece_sums(xa1, xb1, xp1, ma1, mp1, mean1, NORM.span_all, NORM.kind == LAYER)
            if NORM.span_all:
                q0 = q0 + q1
        if STATS == STATS_STORE:  # head parallel, pass 1: this rank's sum of squares only
            tl.store(stats_ptr + tok, q0)
        if STATS == STATS_LOAD:  # head parallel, pass 2: the sum over every rank's heads
            q0 = tl.load(stats_ptr + tok)
        rstd0 = 1.0 / tl.sqrt(q0 / args.n + args.eps)
        if P1 > 0:
            if NORM.span_all:
                rstd1 = rstd0
            else:
                rstd1 = 1.0 / tl.sqrt(q1 / args.n + args.eps)

    return mean0, rstd0, mean1, rstd1, alpha


@jit
def _norm_rope_tensor(x, t, args, stats_ptr, th, NORM: tl.constexpr, FORM: tl.constexpr):
    """Normalise, rotate and store one tensor's tiles ``x`` (loaded by ``_load_tensor``);
    ``stats_ptr``: its per-token sums of squares (``FORM.stats``)."""
    R2: tl.constexpr = FORM.r2
    P: tl.constexpr = FORM.d - 2 * R2
    P0: tl.constexpr = FORM.tile.piece0
    P1: tl.constexpr = FORM.tile.piece1
    STATS: tl.constexpr = FORM.stats
    h_start = th.h_start
    xa0, xb0, xp0, xa1, xb1, xp1 = x
    ia = tl.arange(0, FORM.tile.half_pad)[None, :]
    jp = tl.arange(0, FORM.tile.pass_pad)[None, :]
    # from here on the offsets are those of the program's first head
    t = _qk_out(t, t.obase + h_start * t.o_strides[2])
    th = TokenHeads(
        th.tok, h_start, th.h_end, th.row, th.scbase + h_start * th.sc_strides[1], th.sc_strides
    )
    hh0, hm0 = _local_heads(h_start, th.h_end, 0, P0, FORM.off64)
    ma0 = hm0 & (ia < R2)
    mp0 = hm0 & (jp < P)
    ma1 = ma0
    mp1 = mp0
    if P1 > 0:
        hh1, hm1 = _local_heads(h_start, th.h_end, P0, P1, FORM.off64)
        ma1 = hm1 & (ia < R2)
        mp1 = hm1 & (jp < P)

    # --- statistics (fp32) ---------------------------------------------------------
    mean0, rstd0, mean1, rstd1, alpha = _norm_stats(
        x, (ma0, mp0, ma1, mp1), t.a_ptr, args, stats_ptr, th.tok, P1=P1, NORM=NORM, STATS=STATS
    )

    # --- normalise, rotate, store --------------------------------------------------
    if STATS != STATS_STORE:
        x0 = (xa0, xb0, xp0)
        _finish_piece(x0, mp0, mean0, rstd0, alpha, hh0, hm0, t, th, NORM=NORM, FORM=FORM)
        if P1 > 0:
            x1 = (xa1, xb1, xp1)
            _finish_piece(x1, mp1, mean1, rstd1, alpha, hh1, hm1, t, th, NORM=NORM, FORM=FORM)


@triton.constexpr_function
def _token_form(d, r2, tile, rope, round_norm, stats, off64, x_words, quant):
    """The kernel's constexprs as a :class:`TokenForm` (``tile`` and ``rope`` rebuilt:
    Triton's interpreter hands a NamedTuple to a constexpr function as a plain tuple)."""
    return TokenForm(
        d, r2, TokenTile(*tile), RopeFlags(*rope), round_norm, stats, off64, x_words, quant
    )


@jit
def _qk_norm_rope_kernel(
    q_ptr,
    qo_ptr,  # Q in / out (may be the same memory: in place)
    k_ptr,
    ko_ptr,  # K in / out (unused when HAS_K is false)
    cos_ptr,
    sin_ptr,  # rotary tables, any float dtype
    pos_ptr,  # int positions (B, S) gathering table rows (ROPE.positions)
    qw_ptr,
    qb_ptr,
    qa_ptr,  # Q norm weight, bias, DyT alpha
    kw_ptr,
    kb_ptr,
    ka_ptr,  # K norm weight, bias, DyT alpha
    q_alpha,
    k_alpha,  # DyT alpha when given as a Python float
    q_eps,
    k_eps,
    q_n,
    k_n,  # channels one norm statistic spans (D or H*D), as float
    q_stats_ptr,
    k_stats_ptr,  # fp32 (B*S,) each: per-token sums of squares of Q, K (STATS)
    q_scale_ptr,
    k_scale_ptr,  # fp32 (B, H, S) each: a scale per head and token (QUANT)
    S,
    H,  # tokens per batch entry, heads
    q_strides,
    qo_strides,  # (b, s, h, d) strides of Q and its output
    k_strides,
    ko_strides,
    cos_strides,
    sin_strides,  # (b, s, h, w)
    pos_strides,  # (b, s)
    scale_strides,  # (b, h, s) of both scale tensors
    D: tl.constexpr,  # head_dim
    R2: tl.constexpr,  # rotary_dim // 2 (0 without RoPE); D - 2 * R2 pass through
    TILE: tl.constexpr,  # TokenTile: the program's heads and channels as tiles
    Q_NORM: tl.constexpr,
    K_NORM: tl.constexpr,  # NormFlags
    HAS_K: tl.constexpr,
    ROPE: tl.constexpr,  # RopeFlags
    ROUND_NORM: tl.constexpr,  # round to the activation dtype between norm and rotation
    STATS: tl.constexpr,  # 0, STATS_STORE or STATS_LOAD (head-parallel passes)
    OFF64: tl.constexpr,  # offsets within a token need 64 bits (huge head strides)
    X_WORDS: tl.constexpr = False,  # interleaved 16-bit Q / K rows read and written a pair a word
    QUANT: tl.constexpr = 0,  # NO_QUANT: outputs in the activation dtype; INT8, FP8:
    # 8-bit, each head of a token with its fp32 scale
):
    tok = tl.program_id(0).to(tl.int64)
    h_start = tl.program_id(1).to(tl.int64) * TILE.heads
    h_end = tl.minimum(h_start + TILE.heads, H)
    b = tok // S
    s = tok - b * S

    row = _table_row(
        cos_ptr, sin_ptr, pos_ptr, b, s, cos_strides, sin_strides, pos_strides, ROPE=ROPE
    )

    # each tensor's token offsets, its input's and its output's, up front (placed elsewhere
    # they change the sm_90 builds' scheduling)
    q = _qk_tensor(q_ptr, q_strides, qo_ptr, qo_strides, qw_ptr, qb_ptr, qa_ptr, q_scale_ptr, b, s)
    q = _out_at(q, b, s)
    k = _qk_tensor(k_ptr, k_strides, ko_ptr, ko_strides, kw_ptr, kb_ptr, ka_ptr, k_scale_ptr, b, s)
    k = _out_at(k, b, s)
    scbase = b * scale_strides[0] + s * scale_strides[2]
    th = TokenHeads(tok, h_start, h_end, row, scbase, scale_strides)
    FORM: tl.constexpr = _token_form(D, R2, TILE, ROPE, ROUND_NORM, STATS, OFF64, X_WORDS, QUANT)
    # Issue every load of Q and K before the first store: the compiler may not move a load
    # of K above a store to Q (they could alias), and one memory latency per program is
    # what the kernel can afford.
    qx = _load_tensor(q, th, FORM)
    if HAS_K:
        kx = _load_tensor(k, th, FORM)
    q_args = NormArgs(q_alpha, q_eps, q_n)
    _norm_rope_tensor(qx, q, q_args, q_stats_ptr, th, NORM=Q_NORM, FORM=FORM)
    if HAS_K:
        k_args = NormArgs(k_alpha, k_eps, k_n)
        _norm_rope_tensor(kx, k, k_args, k_stats_ptr, th, NORM=K_NORM, FORM=FORM)
