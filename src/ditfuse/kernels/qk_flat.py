"""The flat-row kernel of the fused QK-norm + RoPE (private; launched by
:mod:`ditfuse.ops.qk_norm_rope`): one token a program, its H*D channels held as flat rows.

Used where the norm spans every head of the token (Wan's RMSNorm across 40 x 128 channels),
or there is no norm, and the interleaved rotation covers whole heads. The per-token kernel
(:mod:`ditfuse.kernels.qk_token`) holds a token as [heads, pairs] tiles so that per-head
statistics are one reduction each; with one statistic for the whole token that structure
only costs instructions. This kernel is bound by instruction issue as much as by bytes
(``docs/design/qk_norm_rope.md``, which has its calibration against the per-token kernel),
so the row is held as at most two power-of-two pieces with no dead lanes (5120 = 4096 + 1024
channels; a power-of-two tile would carry 8192 lanes).

Lane c of a piece is channel c = h * D + d of the token; with the token's heads contiguous
(``ROW_CONTIG``) its offset is c itself, so loads and stores vectorise. Rotary pairs are
interleaved, (2i, 2i+1) (Wan, FLUX, Qwen-Image, HunyuanVideo), split from a [pairs, 2]
view of the piece in registers; rotate-half pairs go to the per-token kernel. Arithmetic
per element is the per-token kernel's (``_norm_affine``, the same rotation, the same
roundings); only the order of the fp32 sums differs (over the whole token instead of per
head, then over heads). Offsets within a token are 32-bit, added to the token's 64-bit
base. Tensors travel with their strides as tuples, norms and the rotation as
:class:`~ditfuse.kernels.common.NormFlags` / :class:`~ditfuse.kernels.common.RopeFlags`,
Q and K as :class:`~ditfuse.kernels.common.QKTensor`, as in the per-token kernel; the
kernel's layout constexprs are one :class:`FlatForm` (``FORM``), the token's pieces and
table row a :class:`FlatToken`, and piece 0 / 1 a constexpr index (``PIECE``).

Two forms of the same arithmetic: the *channel form* above, and the *pair form*
(``_pairs_program``, constexpr ``PAIRS``, which the launcher sets for 16-bit rows that are
contiguous and pair-aligned, Q and K in programs of their own with norms of one body), which
holds a piece as [pairs] of 32-bit words, each an interleaved pair (2i, 2i+1), and needs no
reshape, split or join for the rotation (faster at Wan: ``docs/design/qk_norm_rope.md``).

With ``QUANT`` (``INT8`` or ``FP8``) both forms store 8-bit values with one fp32 scale per
head of the token, after the same statistics as the 16-bit store: the fp32 sums run in the
same order, so the 8-bit values are bitwise the quantization of what the 16-bit call stores
(``docs/qk_norm_rope.md``, "8-bit output"). Each piece holds whole heads (D, a power of two,
divides both power-of-two pieces and where the second starts), so a head's amax is one
reduction of the piece viewed as [heads, D], with the per-token kernel's rounding
(``_quant_scale``, ``_quant_values``) and its store held to the 16-bit store's vector width
(``_same_order``: on the GPU the width sets the register layout of the sums).
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
    QKTensor,
    RopeFlags,
    _alpha,
    _nan_in,
    _norm_affine,
    _out_at,
    _qk_tensor,
    _quant_ptr,
    _quant_scale,
    _quant_values,
    _same_order,
    _table_at,
    _table_head,
    _table_row,
)
from ditfuse.kernels.element import _PTX, _cast_out, _pack, _rnd, _unpack
from ditfuse.runtime.backend import jit


class FlatForm(NamedTuple):
    """How a program of the flat-row kernel holds its token (``FORM``: constexpr fields)."""

    d: int  # head_dim (the rotary width when ROPE), a power of two
    n: tuple  # channels of piece 0 and piece 1 (powers of two; 0: no piece 1)
    mask: tuple  # whether piece 0 / piece 1 reaches past the token
    row_contig: bool  # every tensor's token row is its H*D channels, contiguous
    rope: RopeFlags
    round_norm: bool  # round to the activation dtype between norm and rotation
    quant: int  # NO_QUANT, INT8 or FP8


class FlatToken(NamedTuple):
    """A program's token as the flat-row helpers read it (``tk``)."""

    pieces: Any  # (indices, liveness) of piece 0 and of piece 1 (piece 0's where none):
    # channels in the channel form, pairs in the pair form
    nc: Any  # channels of the token (H*D)
    row: Any  # the token's TableRow
    scbase: Any  # the 8-bit scales' element offset of the token, and their (b, h, s) strides
    sc_strides: Any


@triton.constexpr_function
def _flat_form(d, n0, n1, mask0, mask1, row_contig, rope, round_norm, quant):
    """The kernel's constexprs as a :class:`FlatForm` (``rope`` rebuilt: Triton's interpreter
    hands a NamedTuple to a constexpr function as a plain tuple)."""
    return FlatForm(d, (n0, n1), (mask0, mask1), row_contig, RopeFlags(*rope), round_norm, quant)


@jit
def _piece(C0: tl.constexpr, N: tl.constexpr, NC):
    """Channels of one piece (``N`` from ``C0``) and their liveness (``c < NC``, used only
    by a piece that reaches past the token: ``MASKED``)."""
    c = C0 + tl.arange(0, N)
    return c, c < NC


@jit
def _ld(p, live, MASKED: tl.constexpr):
    """fp32 values at ``p``, zero at dead lanes where the piece has any (``MASKED``)."""
    if MASKED:
        return tl.load(p, mask=live, other=0.0).to(tl.float32)
    else:
        return tl.load(p).to(tl.float32)


@jit
def _offsets(c, stride_h, stride_d, D: tl.constexpr, ROW_CONTIG: tl.constexpr):
    """Offsets of the token's channels ``c`` (h * D + d) in a tensor with these strides."""
    if ROW_CONTIG:
        return c  # visibly contiguous: the loads and stores vectorise
    else:
        h = c // D
        return h * stride_h + (c - h * D) * stride_d


@jit
def _load_piece(t, tk, PIECE: tl.constexpr, FORM: tl.constexpr):
    """Piece ``PIECE`` of the token's channels of ``t``'s input, as loaded."""
    c, live = tk.pieces[PIECE]
    p = t.x_ptr + t.xbase + _offsets(c, t.x_strides[2], t.x_strides[3], FORM.d, FORM.row_contig)
    if FORM.mask[PIECE]:
        return tl.load(p, mask=live, other=0.0)
    else:
        return tl.load(p)


@jit
def _f32_again(x):
    """``x`` (as loaded) in fp32, written so that the compiler does not merge it with the
    ``.to(tl.float32)`` of the statistics: the loaded 16-bit pairs stay packed, one register
    per two channels, until the normalisation (registers set the programs a SM)."""
    if x.dtype == tl.bfloat16:
        return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    elif x.dtype == tl.float16 and _PTX:
        return tl.inline_asm_elementwise(
            "cvt.f32.f16 $0, $1;", "=r,h", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return x.to(tl.float32)


@jit
def _store_scales(
    scale, t, tk, C0: tl.constexpr, NH: tl.constexpr, FORM: tl.constexpr, PIECE: tl.constexpr
):
    """The fp32 scales of piece ``PIECE``'s NH heads (from channel C0) in ``t``'s scale tensor,
    heads past the token's channels (a piece's dead lanes: whole heads) left out."""
    D: tl.constexpr = FORM.d
    h = C0 // D + tl.arange(0, NH)
    p = t.sc_ptr + tk.scbase + h.to(tl.int64) * tk.sc_strides[1]
    if FORM.mask[PIECE]:
        tl.store(p, scale, mask=h * D < tk.nc)
    else:
        tl.store(p, scale)


@jit
def _quantize_piece(y, t, tk, PIECE: tl.constexpr, FORM: tl.constexpr, ACT: tl.constexpr):
    """The channel form's 8-bit store of piece ``PIECE``: ``y`` rounded to ``ACT`` as the 16-bit
    store rounds it, viewed as [heads, D] for each head's amax and scale, quantized, stored."""
    c, live = tk.pieces[PIECE]
    D: tl.constexpr = FORM.d
    N: tl.constexpr = FORM.n[PIECE]
    C0: tl.constexpr = PIECE * FORM.n[0]  # piece 1 starts where piece 0 ends
    QUANT: tl.constexpr = FORM.quant
    tl.static_assert(N % D == 0 and C0 % D == 0, "a piece holds whole heads")
    NH: tl.constexpr = N // D
    if ACT != tl.float32:
        y = _rnd(y, ACT)
    y2 = tl.reshape(y, (NH, D))
    a2 = tl.abs(y2)
    scale, inv = _quant_scale(tl.max(a2, 1) + _nan_in(a2, 1), QUANT)  # NaN: a NaN scale
    _store_scales(scale, t, tk, C0=C0, NH=NH, FORM=FORM, PIECE=PIECE)
    v = tl.reshape(_quant_values(y2, inv[:, None], QUANT), (N,))
    qo_ptr = _quant_ptr(t.o_ptr, QUANT)
    # vectorised no wider than the 16-bit store (128 bits of ACT a thread): see _same_order
    p = (
        qo_ptr
        + t.obase
        + _same_order(
            _offsets(c, t.o_strides[2], t.o_strides[3], D, FORM.row_contig),
            128 // ACT.primitive_bitwidth,
        )
    )
    if FORM.mask[PIECE]:
        tl.store(p, _cast_out(v, qo_ptr.dtype.element_ty), mask=live)
    else:
        tl.store(p, _cast_out(v, qo_ptr.dtype.element_ty))


@jit
def _finish_piece(x, stats, t, tk, PIECE: tl.constexpr, NORM: tl.constexpr, FORM: tl.constexpr):
    """Weight, bias, rotate and store piece ``PIECE`` of ``t`` with the token's statistics
    ``stats`` (mean, rstd, DyT's alpha)."""
    mean, rstd, alpha = stats
    ACT: tl.constexpr = t.x_ptr.dtype.element_ty
    c, live = tk.pieces[PIECE]
    D: tl.constexpr = FORM.d
    N: tl.constexpr = FORM.n[PIECE]
    C0: tl.constexpr = PIECE * FORM.n[0]  # piece 1 starts where piece 0 ends
    MASKED: tl.constexpr = FORM.mask[PIECE]
    w = 1.0
    b = 0.0
    if NORM.has_w:  # the norm spans the token: one weight per channel of it
        w = _ld(t.w_ptr + c, live, MASKED)
    if NORM.has_b:
        b = _ld(t.b_ptr + c, live, MASKED)
    y = _norm_affine(_f32_again(x), w, b, mean, rstd, alpha, NORM=NORM, ACT=ACT)
    if FORM.round_norm:
        y = _rnd(y, ACT)
    if FORM.rope.on:
        # interleaved pairs (2i, 2i+1): a [pairs, 2] view of the piece, split in registers
        ya, yb = tl.split(tl.reshape(y, (N // 2, 2)))
        if FORM.rope.table_half:
            # one column per pair: one cos and one sin a pair, addressed from the pair
            # index (an arange, so a contiguous table's loads stay contiguous) and used for
            # both channels -- the values and arithmetic of the per-channel load below with
            # ca == cb, sa == sb, at half the loads and live registers
            # (docs/design/qk_norm_rope.md, "Tables as the models pass them")
            pi = C0 // 2 + tl.arange(0, N // 2)  # the token's pair index
            pl = pi >= 0  # unused unless MASKED
            if MASKED:
                pl, _ = tl.split(tl.reshape(live, (N // 2, 2)))
            h = pi // (D // 2)
            col = pi - h * (D // 2)
            ca = _ld(_table_at(tk.row.cos, h, col), pl, MASKED)
            sa = _ld(_table_at(tk.row.sin, h, col), pl, MASKED)
            cb = ca
            sb = sa
        else:
            h = c // D
            d = c - h * D
            cs = _ld(_table_at(tk.row.cos, h, d), live, MASKED)
            sn = _ld(_table_at(tk.row.sin, h, d), live, MASKED)
            ca, cb = tl.split(tl.reshape(cs, (N // 2, 2)))
            sa, sb = tl.split(tl.reshape(sn, (N // 2, 2)))
        # eager: x * cos + rotate(x) * sin, no fused multiply-add (the per-token kernel's order)
        oa = ya * ca - yb * sa
        ob = yb * cb + ya * sb
        y = tl.reshape(tl.join(oa, ob), (N,))
    if FORM.quant != NO_QUANT:
        _quantize_piece(y, t, tk, PIECE=PIECE, FORM=FORM, ACT=ACT)
    else:
        p = t.o_ptr + t.obase + _offsets(c, t.o_strides[2], t.o_strides[3], D, FORM.row_contig)
        if MASKED:
            tl.store(p, _cast_out(y, t.o_ptr.dtype.element_ty), mask=live)
        else:
            tl.store(p, _cast_out(y, t.o_ptr.dtype.element_ty))


@jit
def _tiles_sum(x, SQUARES: tl.constexpr):
    """The sum over a piece's fp32 tiles ``x`` (its channels: one tile, or the pair form's
    (lo, hi)) of the values or (``SQUARES``) their squares, the tiles added lane by lane
    before the reduction."""
    v = x[0] * x[0] if SQUARES else x[0]
    if len(x) == 2:
        v += x[1] * x[1] if SQUARES else x[1]
    return tl.sum(v, 0)


@jit
def _centered(x, live, mean):
    """A piece's tiles ``x`` less the mean, zero at dead lanes."""
    if len(x) == 2:
        return tl.where(live, x[0] - mean, 0.0), tl.where(live, x[1] - mean, 0.0)
    else:
        return (tl.where(live, x[0] - mean, 0.0),)


@jit
def _token_stats(x0, x1, live, a_ptr, args, NORM: tl.constexpr, TWO: tl.constexpr):
    """(mean, rstd, DyT's alpha) of the token, one statistic in fp32 over the tiles of piece 0
    and (``TWO``) piece 1, ``live`` their liveness: both forms' sums in one order."""
    l0, l1 = live
    mean = 0.0
    rstd = 1.0
    alpha = _alpha(a_ptr, args.alpha, NORM.kind, NORM.alpha_ptr)
    if NORM.kind == LAYER:
        tot = _tiles_sum(x0, False)
        if TWO:
            tot += _tiles_sum(x1, False)
        mean = tot / args.n
    if NORM.kind == RMS or NORM.kind == LAYER:
        if NORM.kind == LAYER:
            x0 = _centered(x0, l0, mean)
            if TWO:
                x1 = _centered(x1, l1, mean)
        sq = _tiles_sum(x0, True)
        if TWO:
            sq += _tiles_sum(x1, True)
        rstd = 1.0 / tl.sqrt(sq / args.n + args.eps)
    return mean, rstd, alpha


@jit
def _flat_tensor(x, t, args, tk, NORM: tl.constexpr, FORM: tl.constexpr):
    """One statistic for the token (fp32) over ``x`` (:func:`_load_token`'s pieces), then
    each piece normalised, rotated, stored."""
    x0, x1 = x
    N1: tl.constexpr = FORM.n[1]
    l0 = tk.pieces[0][1]
    l1 = tk.pieces[1][1]
    f0 = x0.to(tl.float32)
    f1 = x1
    if N1 > 0:
        f1 = x1.to(tl.float32)
    stats = _token_stats((f0,), (f1,), (l0, l1), t.a_ptr, args, NORM=NORM, TWO=N1 > 0)
    _finish_piece(x0, stats, t, tk, PIECE=0, NORM=NORM, FORM=FORM)
    if N1 > 0:
        _finish_piece(x1, stats, t, tk, PIECE=1, NORM=NORM, FORM=FORM)


@jit
def _load_token(t, tk, FORM: tl.constexpr):
    """The token's channels of ``t``'s input as loaded, (piece 0, piece 1 or 0.0)."""
    x0 = _load_piece(t, tk, 0, FORM)
    x1 = 0.0
    if FORM.n[1] > 0:
        x1 = _load_piece(t, tk, 1, FORM)
    return x0, x1


@jit
def _one_tensor(t, args, tk, NORM: tl.constexpr, FORM: tl.constexpr):
    """Load, normalise, rotate and store one tensor (a program of the split grid)."""
    x = _load_token(t, tk, FORM)
    _flat_tensor(x, t, args, tk, NORM=NORM, FORM=FORM)


# ---- the pair form: a token's 16-bit channels as [pairs] of 32-bit words ----------------
# Interleaved rotary pairs (2i, 2i+1) of a contiguous 16-bit row are the two halves of one
# 32-bit word: loaded, held and stored as words, split by a shift and a mask (bf16) and
# packed back by one cvt.rn.{bf16,f16}x2, the rotation needs no [pairs, 2] reshape, split
# and join of the channel form (which cost most of the rotation's time at Wan:
# docs/design/qk_norm_rope.md). The arithmetic per element is the channel form's.


@jit
def _unpack_again(u, DT: tl.constexpr):
    """``_unpack`` written so that the compiler does not merge it with the statistics' one:
    the words stay packed, one register per two channels, until the normalisation."""
    if _PTX:
        if DT == tl.bfloat16:
            ASM: tl.constexpr = "shl.b32 $0, $2, 16;\n\tand.b32 $1, $2, -65536;"
        else:
            ASM: tl.constexpr = (
                "{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, $2;\n\tcvt.f32.f16 $0, l;"
                "\n\tcvt.f32.f16 $1, h;\n\t}"
            )
        return tl.inline_asm_elementwise(
            ASM, "=r,=r,r", [u], dtype=(tl.float32, tl.float32), is_pure=True, pack=1
        )
    else:
        return _unpack(u, DT)


@jit
def _rnd_pair(lo, hi, DT: tl.constexpr):
    """``_rnd`` of both: on the GPU one pack and the unpack (3 instructions a pair, not 4)."""
    if _PTX:
        return _unpack(_pack(lo, hi, DT), DT)
    else:
        return _rnd(lo, DT), _rnd(hi, DT)


@jit
def _ld_pairs(ptr, p, live, MASKED: tl.constexpr, WORDS: tl.constexpr, stride=1):
    """Elements 2p and 2p+1 (``stride`` apart) after ``ptr`` as fp32. ``WORDS``: one 32-bit
    (16-bit values) or 64-bit (fp32 values) load a pair (unit stride, ``ptr`` aligned to a
    pair), else two loads."""
    DT: tl.constexpr = ptr.dtype.element_ty
    if WORDS and DT.primitive_bitwidth == 16:
        wp = ptr.to(tl.pointer_type(tl.uint32)) + p
        if MASKED:
            return _unpack(tl.load(wp, mask=live, other=0), DT)
        else:
            return _unpack(tl.load(wp), DT)
    elif WORDS:
        wp = ptr.to(tl.pointer_type(tl.uint64)) + p
        if MASKED:
            u = tl.load(wp, mask=live, other=0)
        else:
            u = tl.load(wp)
        return (u & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True), (u >> 32).to(
            tl.uint32
        ).to(tl.float32, bitcast=True)
    else:
        return _ld(ptr + (2 * p) * stride, live, MASKED), _ld(
            ptr + (2 * p + 1) * stride, live, MASKED
        )


@jit
def _pairs_piece(P0: tl.constexpr, P: tl.constexpr, NP):
    """Pair indices of one piece (``P`` from ``P0``) and their liveness (``p < NP``)."""
    p = P0 + tl.arange(0, P)
    return p, p < NP


@jit
def _load_words(ptr, base, p, live, MASKED: tl.constexpr):
    wp = (ptr + base).to(tl.pointer_type(tl.uint32)) + p
    if MASKED:
        return tl.load(wp, mask=live, other=0)
    else:
        return tl.load(wp)


@jit
def _quantize_pairs(oa, ob, t, tk, PIECE: tl.constexpr, FORM: tl.constexpr, ACT: tl.constexpr):
    """The pair form's 8-bit store of piece ``PIECE``: its pairs rounded to ``ACT`` as the
    16-bit store's pack rounds them, viewed as [heads, D/2] for each head's amax and scale;
    a pair's two bytes stored as one 16-bit word (lo = channel 2p)."""
    p, live = tk.pieces[PIECE]
    D: tl.constexpr = FORM.d
    NP: tl.constexpr = FORM.n[PIECE] // 2
    Q0: tl.constexpr = PIECE * FORM.n[0] // 2  # piece 1 starts where piece 0 ends
    QUANT: tl.constexpr = FORM.quant
    HP: tl.constexpr = D // 2
    tl.static_assert(NP % HP == 0 and Q0 % HP == 0, "a piece holds whole heads")
    NH: tl.constexpr = NP // HP
    if ACT != tl.float32:
        oa, ob = _rnd_pair(oa, ob, ACT)
    a2 = tl.reshape(oa, (NH, HP))
    b2 = tl.reshape(ob, (NH, HP))
    xa, xb = tl.abs(a2), tl.abs(b2)
    amax = tl.maximum(tl.max(xa, 1), tl.max(xb, 1)) + (_nan_in(xa, 1) + _nan_in(xb, 1))
    scale, inv = _quant_scale(amax, QUANT)  # a NaN in the head: a NaN scale
    _store_scales(scale, t, tk, C0=2 * Q0, NH=NH, FORM=FORM, PIECE=PIECE)
    va = tl.reshape(_quant_values(a2, inv[:, None], QUANT), (NP,))
    vb = tl.reshape(_quant_values(b2, inv[:, None], QUANT), (NP,))
    # int8: the two's-complement byte of the int32; fp8: the bit pattern (0..255)
    va = va.to(tl.uint32, bitcast=True) & 0xFF
    vb = vb.to(tl.uint32, bitcast=True) & 0xFF
    word = (va | (vb << 8)).to(tl.uint16)
    # vectorised no wider than the 16-bit store (4 words a thread): see _same_order
    wp = (t.o_ptr + t.obase).to(tl.pointer_type(tl.uint16)) + _same_order(p, 4)
    if FORM.mask[PIECE]:
        tl.store(wp, word, mask=live)
    else:
        tl.store(wp, word)


@jit
def _finish_pairs(u, stats, t, tk, PIECE: tl.constexpr, NORM: tl.constexpr, FORM: tl.constexpr):
    """``_finish_piece`` in the pair form: (lo, hi) = channels (2p, 2p+1) of the pairs p of
    piece ``PIECE``."""
    mean, rstd, alpha = stats
    ACT: tl.constexpr = t.x_ptr.dtype.element_ty
    p, live = tk.pieces[PIECE]
    D: tl.constexpr = FORM.d
    MASKED: tl.constexpr = FORM.mask[PIECE]
    xa, xb = _unpack_again(u, ACT)
    wa = 1.0
    wb = 1.0
    ba = 0.0
    bb = 0.0
    if NORM.has_w:
        wa, wb = _ld_pairs(t.w_ptr, p, live, MASKED, NORM.words)
    if NORM.has_b:
        ba, bb = _ld_pairs(t.b_ptr, p, live, MASKED, NORM.words)
    ya = _norm_affine(xa, wa, ba, mean, rstd, alpha, NORM=NORM, ACT=ACT)
    yb = _norm_affine(xb, wb, bb, mean, rstd, alpha, NORM=NORM, ACT=ACT)
    if FORM.round_norm:
        ya, yb = _rnd_pair(ya, yb, ACT)
    if FORM.rope.on:
        h = p // (D // 2)
        # the pair within its head, as a mask (D a power of two): the compiler then sees that
        # a thread's pairs in different heads read the same table words, and loads them once
        i = p & (D // 2 - 1)
        if FORM.rope.table_half:  # one column a pair, used for both channels
            ca = _ld(_table_at(tk.row.cos, h, i), live, MASKED)
            sa = _ld(_table_at(tk.row.sin, h, i), live, MASKED)
            cb = ca
            sb = sa
        else:
            cos = tk.row.cos
            sin = tk.row.sin
            ca, cb = _ld_pairs(_table_head(cos, h), i, live, MASKED, FORM.rope.words, cos.w)
            sa, sb = _ld_pairs(_table_head(sin, h), i, live, MASKED, FORM.rope.words, sin.w)
        # eager: x * cos + rotate(x) * sin, no fused multiply-add (the channel form's order)
        oa = ya * ca - yb * sa
        ob = yb * cb + ya * sb
    else:
        oa = ya
        ob = yb
    if FORM.quant != NO_QUANT:
        _quantize_pairs(oa, ob, t, tk, PIECE=PIECE, FORM=FORM, ACT=ACT)
    else:
        wp = (t.o_ptr + t.obase).to(tl.pointer_type(tl.uint32)) + p
        if MASKED:
            tl.store(wp, _pack(oa, ob, ACT), mask=live)
        else:
            tl.store(wp, _pack(oa, ob, ACT))


@jit
def _pairs_tensor(u, t, args, tk, NORM: tl.constexpr, FORM: tl.constexpr):
    """``_flat_tensor`` in the pair form: one statistic for the token over the words ``u``
    (piece 0, piece 1), then each piece."""
    u0, u1 = u
    ACT: tl.constexpr = t.x_ptr.dtype.element_ty
    P1: tl.constexpr = FORM.n[1] // 2
    l0 = tk.pieces[0][1]
    l1 = tk.pieces[1][1]
    a0, b0 = _unpack(u0, ACT)
    a1 = a0
    b1 = b0
    if P1 > 0:
        a1, b1 = _unpack(u1, ACT)
    stats = _token_stats((a0, b0), (a1, b1), (l0, l1), t.a_ptr, args, NORM=NORM, TWO=P1 > 0)
    _finish_pairs(u0, stats, t, tk, PIECE=0, NORM=NORM, FORM=FORM)
    if P1 > 0:
        _finish_pairs(u1, stats, t, tk, PIECE=1, NORM=NORM, FORM=FORM)


@jit
def _pairs_program(q, q_args, k, k_args, tk, NORM: tl.constexpr, FORM: tl.constexpr):
    """Program (token, 0) does the token's Q, (token, 1) its K, in the pair form (the flat
    kernel with PAIRS, which the launcher sets only with Q and K in programs of their own
    and norms of one body: one set of norm flags here, Q's)."""
    # one body on the operands selected by the program's axis (the launcher's
    # ``_same_body``): one copy of the body is faster than two (docs/design/qk_norm_rope.md)
    isq = tl.program_id(1) == 0
    x_ptr = tl.where(isq, q.x_ptr, k.x_ptr)
    xbase = tl.where(isq, q.xbase, k.xbase)
    p0, l0 = tk.pieces[0]
    p1, l1 = tk.pieces[1]
    u0 = _load_words(x_ptr, xbase, p0, l0, FORM.mask[0])
    u1 = u0
    if FORM.n[1] > 0:
        u1 = _load_words(x_ptr, xbase, p1, l1, FORM.mask[1])
    # (the operands selected in the order the body's first use of each wants them)
    o_ptr = tl.where(isq, q.o_ptr, k.o_ptr)
    obase = tl.where(isq, q.obase, k.obase)
    w_ptr = tl.where(isq, q.w_ptr, k.w_ptr)
    b_ptr = tl.where(isq, q.b_ptr, k.b_ptr)
    a_ptr = tl.where(isq, q.a_ptr, k.a_ptr)
    args = NormArgs(
        tl.where(isq, q_args.alpha, k_args.alpha),
        tl.where(isq, q_args.eps, k_args.eps),
        tl.where(isq, q_args.n, k_args.n),
    )
    sc_ptr = tl.where(isq, q.sc_ptr, k.sc_ptr)
    # (the pair form's rows are contiguous: no strides)
    t = QKTensor(x_ptr, xbase, 0, o_ptr, obase, 0, w_ptr, b_ptr, a_ptr, sc_ptr)
    _pairs_tensor((u0, u1), t, args, tk, NORM=NORM, FORM=FORM)


@jit
def _qk_norm_rope_flat_kernel(
    q_ptr,
    qo_ptr,  # Q in / out (may be the same memory: in place)
    k_ptr,
    ko_ptr,  # K in / out (unused when HAS_K is false)
    cos_ptr,
    sin_ptr,  # rotary tables, any float dtype
    pos_ptr,  # int positions (B, S) gathering table rows (ROPE.positions)
    qw_ptr,
    qb_ptr,
    qa_ptr,  # Q norm weight, bias, DyT alpha (H*D channels)
    kw_ptr,
    kb_ptr,
    ka_ptr,  # K norm weight, bias, DyT alpha
    q_alpha,
    k_alpha,  # DyT alpha when given as a Python float
    q_eps,
    k_eps,
    q_n,
    k_n,  # channels the statistic spans (H*D), as float
    q_scale_ptr,
    k_scale_ptr,  # fp32 (B, H, S) each: a scale per head and token (QUANT)
    S,
    NC,  # tokens per batch entry; channels of a token (H*D)
    q_strides,
    qo_strides,  # (b, s, h, d) strides of Q and its output
    k_strides,
    ko_strides,
    cos_strides,
    sin_strides,  # (b, s, h, w)
    pos_strides,  # (b, s)
    scale_strides,  # (b, h, s) of both scale tensors
    D: tl.constexpr,  # head_dim (the rotary width when ROPE), a power of two
    N0: tl.constexpr,  # channels of piece 0 (a power of two, from channel 0)
    N1: tl.constexpr,  # channels of piece 1 (a power of two from N0; 0: none)
    MASK0: tl.constexpr,  # piece 0 reaches past the token (a token under N0 channels)
    MASK1: tl.constexpr,  # piece 1 reaches past the token
    Q_NORM: tl.constexpr,
    K_NORM: tl.constexpr,  # NormFlags
    HAS_K: tl.constexpr,
    ROPE: tl.constexpr,  # RopeFlags (interleaved pairs over whole heads)
    ROUND_NORM: tl.constexpr,  # round to the activation dtype between norm and rotation
    ROW_CONTIG: tl.constexpr,  # every tensor's token row is its H*D channels, contiguous
    SPLIT_QK: tl.constexpr,  # grid (tokens, 2): Q and K in programs of their own
    PAIRS: tl.constexpr = False,  # the pair form (with SPLIT_QK): 16-bit rows, contiguous,
    # 4-byte aligned, even H*D; pieces N0, N1 = N0/2, N1/2 words
    QUANT: tl.constexpr = 0,  # NO_QUANT: outputs in the activation dtype; INT8, FP8:
    # 8-bit, each head of a token with its fp32 scale
):
    tok = tl.program_id(0).to(tl.int64)
    b = tok // S
    s = tok - b * S
    scbase = b * scale_strides[0] + s * scale_strides[2]
    FORM: tl.constexpr = _flat_form(D, N0, N1, MASK0, MASK1, ROW_CONTIG, ROPE, ROUND_NORM, QUANT)
    if PAIRS:
        tl.static_assert(SPLIT_QK and HAS_K, "the pair form runs Q and K in programs of their own")
        c0, l0 = _pairs_piece(0, N0 // 2, NC // 2)  # pair indices
        c1 = c0
        l1 = l0
        if N1 > 0:
            c1, l1 = _pairs_piece(N0 // 2, N1 // 2, NC // 2)
    else:
        c0, l0 = _piece(0, N0, NC)
        c1 = c0
        l1 = l0
        if N1 > 0:
            c1, l1 = _piece(N0, N1, NC)
    row = _table_row(
        cos_ptr, sin_ptr, pos_ptr, b, s, cos_strides, sin_strides, pos_strides, ROPE=ROPE
    )
    tk = FlatToken(((c0, l0), (c1, l1)), NC, row, scbase, scale_strides)
    q = _qk_tensor(q_ptr, q_strides, qo_ptr, qo_strides, qw_ptr, qb_ptr, qa_ptr, q_scale_ptr, b, s)
    k = _qk_tensor(k_ptr, k_strides, ko_ptr, ko_strides, kw_ptr, kb_ptr, ka_ptr, k_scale_ptr, b, s)
    q_args = NormArgs(q_alpha, q_eps, q_n)
    k_args = NormArgs(k_alpha, k_eps, k_n)
    if PAIRS:
        _pairs_program(
            _out_at(q, b, s), q_args, _out_at(k, b, s), k_args, tk, NORM=Q_NORM, FORM=FORM
        )
    elif SPLIT_QK:  # program (token, 0) does Q, (token, 1) K: half the live values a program
        if tl.program_id(1) == 0:
            _one_tensor(_out_at(q, b, s), q_args, tk, NORM=Q_NORM, FORM=FORM)
        else:
            _one_tensor(_out_at(k, b, s), k_args, tk, NORM=K_NORM, FORM=FORM)
    else:
        # both tensors' loads before the first store (a store to Q may alias K for the
        # compiler: one memory latency a program, not two)
        qx = _load_token(q, tk, FORM)
        if HAS_K:
            kx = _load_token(k, tk, FORM)
        _flat_tensor(qx, _out_at(q, b, s), q_args, tk, NORM=Q_NORM, FORM=FORM)
        if HAS_K:
            _flat_tensor(kx, _out_at(k, b, s), k_args, tk, NORM=K_NORM, FORM=FORM)
