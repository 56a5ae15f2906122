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
as in the per-token kernel.

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

import triton.language as tl

from ditfuse.kernels.common import (
    LAYER,
    NO_QUANT,
    RMS,
    NormArgs,
    _alpha,
    _nan_in,
    _norm_affine,
    _quant_ptr,
    _quant_scale,
    _quant_values,
    _same_order,
    _table_row,
)
from ditfuse.kernels.element import _PTX, _cast_out, _pack, _rnd, _unpack
from ditfuse.runtime.backend import jit


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
def _load_piece(
    ptr, base, c, live, strides, D: tl.constexpr, ROW_CONTIG: tl.constexpr, MASKED: tl.constexpr
):
    p = ptr + base + _offsets(c, strides[2], strides[3], D, ROW_CONTIG)
    if MASKED:
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
    sc_ptr,
    scbase,
    sc_strides,
    scale,
    NC,
    C0: tl.constexpr,
    D: tl.constexpr,
    NH: tl.constexpr,
    MASKED: tl.constexpr,
):
    """The fp32 scales of a piece's NH heads (from channel C0), heads past the token's NC
    channels (a piece's dead lanes: whole heads) left out."""
    h = C0 // D + tl.arange(0, NH)
    p = sc_ptr + scbase + h.to(tl.int64) * sc_strides[1]
    if MASKED:
        tl.store(p, scale, mask=h * D < NC)
    else:
        tl.store(p, scale)


@jit
def _quantize_piece(
    y,
    c,
    live,
    o_ptr,
    obase,
    o_strides,
    sc_ptr,
    scbase,
    sc_strides,
    NC,
    C0: tl.constexpr,
    D: tl.constexpr,
    N: tl.constexpr,
    ROW_CONTIG: tl.constexpr,
    MASKED: tl.constexpr,
    ACT: tl.constexpr,
    QUANT: tl.constexpr,
):
    """The channel form's 8-bit store: ``y`` rounded to ``ACT`` as the 16-bit store rounds
    it, viewed as [heads, D] for each head's amax and scale, quantized, stored."""
    tl.static_assert(N % D == 0 and C0 % D == 0, "a piece holds whole heads")
    NH: tl.constexpr = N // D
    if ACT != tl.float32:
        y = _rnd(y, ACT)
    y2 = tl.reshape(y, (NH, D))
    a2 = tl.abs(y2)
    scale, inv = _quant_scale(tl.max(a2, 1) + _nan_in(a2, 1), QUANT)  # NaN: a NaN scale
    _store_scales(sc_ptr, scbase, sc_strides, scale, NC, C0=C0, D=D, NH=NH, MASKED=MASKED)
    v = tl.reshape(_quant_values(y2, inv[:, None], QUANT), (N,))
    qo_ptr = _quant_ptr(o_ptr, QUANT)
    # vectorised no wider than the 16-bit store (128 bits of ACT a thread): see _same_order
    p = (
        qo_ptr
        + obase
        + _same_order(
            _offsets(c, o_strides[2], o_strides[3], D, ROW_CONTIG), 128 // ACT.primitive_bitwidth
        )
    )
    if MASKED:
        tl.store(p, _cast_out(v, qo_ptr.dtype.element_ty), mask=live)
    else:
        tl.store(p, _cast_out(v, qo_ptr.dtype.element_ty))


@jit
def _finish_piece(
    x,
    c,
    live,
    mean,
    rstd,
    alpha,
    o_ptr,
    obase,
    o_strides,
    w_ptr,
    b_ptr,
    row,
    sc_ptr,
    scbase,
    sc_strides,
    NC,
    C0: tl.constexpr,
    D: tl.constexpr,
    N: tl.constexpr,
    NORM: tl.constexpr,
    ROPE: tl.constexpr,
    ROUND_NORM: tl.constexpr,
    ROW_CONTIG: tl.constexpr,
    MASKED: tl.constexpr,
    ACT: tl.constexpr,
    QUANT: tl.constexpr,
):
    """Weight, bias, rotate and store one piece with the token's statistics."""
    w = 1.0
    b = 0.0
    if NORM.has_w:  # the norm spans the token: one weight per channel of it
        w = _ld(w_ptr + c, live, MASKED)
    if NORM.has_b:
        b = _ld(b_ptr + c, live, MASKED)
    y = _norm_affine(_f32_again(x), w, b, mean, rstd, alpha, NORM=NORM, ACT=ACT)
    if ROUND_NORM:
        y = _rnd(y, ACT)
    if ROPE.on:
        # interleaved pairs (2i, 2i+1): a [pairs, 2] view of the piece, split in registers
        ya, yb = tl.split(tl.reshape(y, (N // 2, 2)))
        if ROPE.table_half:
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
            ca = _ld(row.cos_ptr + row.cos_base + h * row.cos_h + col * row.cos_w, pl, MASKED)
            sa = _ld(row.sin_ptr + row.sin_base + h * row.sin_h + col * row.sin_w, pl, MASKED)
            cb = ca
            sb = sa
        else:
            h = c // D
            d = c - h * D
            cs = _ld(row.cos_ptr + row.cos_base + h * row.cos_h + d * row.cos_w, live, MASKED)
            sn = _ld(row.sin_ptr + row.sin_base + h * row.sin_h + d * row.sin_w, live, MASKED)
            ca, cb = tl.split(tl.reshape(cs, (N // 2, 2)))
            sa, sb = tl.split(tl.reshape(sn, (N // 2, 2)))
        # eager: x * cos + rotate(x) * sin, no fused multiply-add (the per-token kernel's order)
        oa = ya * ca - yb * sa
        ob = yb * cb + ya * sb
        y = tl.reshape(tl.join(oa, ob), (N,))
    if QUANT != NO_QUANT:
        _quantize_piece(
            y,
            c,
            live,
            o_ptr,
            obase,
            o_strides,
            sc_ptr,
            scbase,
            sc_strides=sc_strides,
            NC=NC,
            C0=C0,
            D=D,
            N=N,
            ROW_CONTIG=ROW_CONTIG,
            MASKED=MASKED,
            ACT=ACT,
            QUANT=QUANT,
        )
    else:
        p = o_ptr + obase + _offsets(c, o_strides[2], o_strides[3], D, ROW_CONTIG)
        if MASKED:
            tl.store(p, _cast_out(y, o_ptr.dtype.element_ty), mask=live)
        else:
            tl.store(p, _cast_out(y, o_ptr.dtype.element_ty))


@jit
def _flat_tensor(
    x0,
    x1,
    c0,
    l0,
    c1,
    l1,
    o_ptr,
    obase,
    o_strides,
    w_ptr,
    b_ptr,
    a_ptr,
    args,
    row,
    sc_ptr,
    scbase,
    sc_strides,
    NC,
    D: tl.constexpr,
    N0: tl.constexpr,
    N1: tl.constexpr,
    MASK0: tl.constexpr,
    MASK1: tl.constexpr,
    NORM: tl.constexpr,
    ROPE: tl.constexpr,
    ROUND_NORM: tl.constexpr,
    ROW_CONTIG: tl.constexpr,
    ACT: tl.constexpr,
    QUANT: tl.constexpr,
):
    """One statistic for the token (fp32), then each piece normalised, rotated, stored."""
    f0 = x0.to(tl.float32)
    f1 = x1
    if N1 > 0:
        f1 = x1.to(tl.float32)
    mean = 0.0
    rstd = 1.0
    alpha = _alpha(a_ptr, args.alpha, NORM.kind, NORM.alpha_ptr)
    if NORM.kind == LAYER:
        tot = tl.sum(f0, 0)
        if N1 > 0:
            tot += tl.sum(f1, 0)
        mean = tot / args.n
    if NORM.kind == RMS or NORM.kind == LAYER:
        d0 = f0
        d1 = f1
        if NORM.kind == LAYER:
            d0 = tl.where(l0, f0 - mean, 0.0)
            if N1 > 0:
                d1 = tl.where(l1, f1 - mean, 0.0)
        sq = tl.sum(d0 * d0, 0)
        if N1 > 0:
            sq += tl.sum(d1 * d1, 0)
        rstd = 1.0 / tl.sqrt(sq / args.n + args.eps)
    _finish_piece(
        x0,
        c0,
        l0,
        mean,
        rstd,
        alpha,
        o_ptr,
        obase,
        o_strides=o_strides,
        w_ptr=w_ptr,
        b_ptr=b_ptr,
        row=row,
        sc_ptr=sc_ptr,
        scbase=scbase,
        sc_strides=sc_strides,
        NC=NC,
        C0=0,
        D=D,
        N=N0,
        NORM=NORM,
        ROPE=ROPE,
        ROUND_NORM=ROUND_NORM,
        ROW_CONTIG=ROW_CONTIG,
        MASKED=MASK0,
        ACT=ACT,
        QUANT=QUANT,
    )
    if N1 > 0:
        _finish_piece(
            x1,
            c1,
            l1,
            mean,
            rstd,
            alpha,
            o_ptr,
            obase,
            o_strides=o_strides,
            w_ptr=w_ptr,
            b_ptr=b_ptr,
            row=row,
            sc_ptr=sc_ptr,
            scbase=scbase,
            sc_strides=sc_strides,
            NC=NC,
            C0=N0,
            D=D,
            N=N1,
            NORM=NORM,
            ROPE=ROPE,
            ROUND_NORM=ROUND_NORM,
            ROW_CONTIG=ROW_CONTIG,
            MASKED=MASK1,
            ACT=ACT,
            QUANT=QUANT,
        )


@jit
def _one_tensor(
    x_ptr,
    xbase,
    x_strides,
    c0,
    l0,
    c1,
    l1,
    o_ptr,
    obase,
    o_strides,
    w_ptr,
    b_ptr,
    a_ptr,
    args,
    row,
    sc_ptr,
    scbase,
    sc_strides,
    NC,
    D: tl.constexpr,
    N0: tl.constexpr,
    N1: tl.constexpr,
    MASK0: tl.constexpr,
    MASK1: tl.constexpr,
    NORM: tl.constexpr,
    ROPE: tl.constexpr,
    ROUND_NORM: tl.constexpr,
    ROW_CONTIG: tl.constexpr,
    QUANT: tl.constexpr,
):
    """Load, normalise, rotate and store one tensor (a program of the split grid)."""
    x0 = _load_piece(x_ptr, xbase, c0, l0, x_strides, D, ROW_CONTIG, MASK0)
    x1 = 0.0
    if N1 > 0:
        x1 = _load_piece(x_ptr, xbase, c1, l1, x_strides, D, ROW_CONTIG, MASK1)
    _flat_tensor(
        x0,
        x1,
        c0,
        l0,
        c1,
        l1,
        o_ptr,
        obase,
        o_strides=o_strides,
        w_ptr=w_ptr,
        b_ptr=b_ptr,
        a_ptr=a_ptr,
        args=args,
        row=row,
        sc_ptr=sc_ptr,
        scbase=scbase,
        sc_strides=sc_strides,
        NC=NC,
        D=D,
        N0=N0,
        N1=N1,
        MASK0=MASK0,
        MASK1=MASK1,
        NORM=NORM,
        ROPE=ROPE,
        ROUND_NORM=ROUND_NORM,
        ROW_CONTIG=ROW_CONTIG,
        ACT=x_ptr.dtype.element_ty,
        QUANT=QUANT,
    )


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
    if _PTX and DT == tl.bfloat16:
        return tl.inline_asm_elementwise(
            "shl.b32 $0, $2, 16;\n\tand.b32 $1, $2, -65536;",
            "=r,=r,r",
            [u],
            dtype=(tl.float32, tl.float32),
            is_pure=True,
            pack=1,
        )
    elif _PTX:
        return tl.inline_asm_elementwise(
            "{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, $2;\n\tcvt.f32.f16 $0, l;"
            "\n\tcvt.f32.f16 $1, h;\n\t}",
            "=r,=r,r",
            [u],
            dtype=(tl.float32, tl.float32),
            is_pure=True,
            pack=1,
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
def _quantize_pairs(
    oa,
    ob,
    p,
    live,
    o_ptr,
    obase,
    sc_ptr,
    scbase,
    sc_strides,
    NC,
    Q0: tl.constexpr,
    NP: tl.constexpr,
    D: tl.constexpr,
    MASKED: tl.constexpr,
    ACT: tl.constexpr,
    QUANT: tl.constexpr,
):
    """The pair form's 8-bit store: pairs ``p`` (NP from pair Q0) rounded to ``ACT`` as the
    16-bit store's pack rounds them, viewed as [heads, D/2] for each head's amax and scale;
    a pair's two bytes stored as one 16-bit word (lo = channel 2p)."""
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
    _store_scales(sc_ptr, scbase, sc_strides, scale, NC, C0=2 * Q0, D=D, NH=NH, MASKED=MASKED)
    va = tl.reshape(_quant_values(a2, inv[:, None], QUANT), (NP,))
    vb = tl.reshape(_quant_values(b2, inv[:, None], QUANT), (NP,))
    # int8: the two's-complement byte of the int32; fp8: the bit pattern (0..255)
    va = va.to(tl.uint32, bitcast=True) & 0xFF
    vb = vb.to(tl.uint32, bitcast=True) & 0xFF
    word = (va | (vb << 8)).to(tl.uint16)
    # vectorised no wider than the 16-bit store (4 words a thread): see _same_order
    wp = (o_ptr + obase).to(tl.pointer_type(tl.uint16)) + _same_order(p, 4)
    if MASKED:
        tl.store(wp, word, mask=live)
    else:
        tl.store(wp, word)


@jit
def _finish_pairs(
    u,
    p,
    live,
    mean,
    rstd,
    alpha,
    o_ptr,
    obase,
    w_ptr,
    b_ptr,
    row,
    sc_ptr,
    scbase,
    sc_strides,
    NC,
    Q0: tl.constexpr,
    NP: tl.constexpr,
    D: tl.constexpr,
    NORM: tl.constexpr,
    ROPE: tl.constexpr,
    ROUND_NORM: tl.constexpr,
    MASKED: tl.constexpr,
    ACT: tl.constexpr,
    QUANT: tl.constexpr,
):
    """``_finish_piece`` in the pair form: (lo, hi) = channels (2p, 2p+1); the piece is NP
    pairs from pair Q0."""
    xa, xb = _unpack_again(u, ACT)
    wa = 1.0
    wb = 1.0
    ba = 0.0
    bb = 0.0
    if NORM.has_w:
        wa, wb = _ld_pairs(w_ptr, p, live, MASKED, NORM.words)
    if NORM.has_b:
        ba, bb = _ld_pairs(b_ptr, p, live, MASKED, NORM.words)
    ya = _norm_affine(xa, wa, ba, mean, rstd, alpha, NORM=NORM, ACT=ACT)
    yb = _norm_affine(xb, wb, bb, mean, rstd, alpha, NORM=NORM, ACT=ACT)
    if ROUND_NORM:
        ya, yb = _rnd_pair(ya, yb, ACT)
    if ROPE.on:
        h = p // (D // 2)
        # the pair within its head, as a mask (D a power of two): the compiler then sees that
        # a thread's pairs in different heads read the same table words, and loads them once
        i = p & (D // 2 - 1)
        if ROPE.table_half:  # one column a pair, used for both channels
            ca = _ld(row.cos_ptr + row.cos_base + h * row.cos_h + i * row.cos_w, live, MASKED)
            sa = _ld(row.sin_ptr + row.sin_base + h * row.sin_h + i * row.sin_w, live, MASKED)
            cb = ca
            sb = sa
        else:
            ca, cb = _ld_pairs(
                row.cos_ptr + row.cos_base + h * row.cos_h, i, live, MASKED, ROPE.words, row.cos_w
            )
            sa, sb = _ld_pairs(
                row.sin_ptr + row.sin_base + h * row.sin_h, i, live, MASKED, ROPE.words, row.sin_w
            )
        # eager: x * cos + rotate(x) * sin, no fused multiply-add (the channel form's order)
        oa = ya * ca - yb * sa
        ob = yb * cb + ya * sb
    else:
        oa = ya
        ob = yb
    if QUANT != NO_QUANT:
        _quantize_pairs(
            oa,
            ob,
            p,
            live,
            o_ptr,
            obase,
            sc_ptr,
            scbase,
            sc_strides=sc_strides,
            NC=NC,
            Q0=Q0,
            NP=NP,
            D=D,
            MASKED=MASKED,
            ACT=ACT,
            QUANT=QUANT,
        )
    else:
        wp = (o_ptr + obase).to(tl.pointer_type(tl.uint32)) + p
        if MASKED:
            tl.store(wp, _pack(oa, ob, ACT), mask=live)
        else:
            tl.store(wp, _pack(oa, ob, ACT))


@jit
def _pairs_tensor(
    u0,
    u1,
    p0,
    l0,
    p1,
    l1,
    o_ptr,
    obase,
    w_ptr,
    b_ptr,
    a_ptr,
    args,
    row,
    sc_ptr,
    scbase,
    sc_strides,
    NC,
    D: tl.constexpr,
    P0: tl.constexpr,
    P1: tl.constexpr,
    MASK0: tl.constexpr,
    MASK1: tl.constexpr,
    NORM: tl.constexpr,
    ROPE: tl.constexpr,
    ROUND_NORM: tl.constexpr,
    ACT: tl.constexpr,
    QUANT: tl.constexpr,
):
    """``_flat_tensor`` in the pair form: one statistic for the token, then each piece."""
    a0, b0 = _unpack(u0, ACT)
    a1 = a0
    b1 = b0
    if P1 > 0:
        a1, b1 = _unpack(u1, ACT)
    mean = 0.0
    rstd = 1.0
    alpha = _alpha(a_ptr, args.alpha, NORM.kind, NORM.alpha_ptr)
    if NORM.kind == LAYER:
        tot = tl.sum(a0 + b0, 0)
        if P1 > 0:
            tot += tl.sum(a1 + b1, 0)
        mean = tot / args.n
    if NORM.kind == RMS or NORM.kind == LAYER:
        if NORM.kind == LAYER:
            a0 = tl.where(l0, a0 - mean, 0.0)
            b0 = tl.where(l0, b0 - mean, 0.0)
            if P1 > 0:
                a1 = tl.where(l1, a1 - mean, 0.0)
                b1 = tl.where(l1, b1 - mean, 0.0)
        sq = tl.sum(a0 * a0 + b0 * b0, 0)
        if P1 > 0:
            sq += tl.sum(a1 * a1 + b1 * b1, 0)
        rstd = 1.0 / tl.sqrt(sq / args.n + args.eps)
    _finish_pairs(
        u0,
        p0,
        l0,
        mean,
        rstd,
        alpha,
        o_ptr,
        obase,
        w_ptr=w_ptr,
        b_ptr=b_ptr,
        row=row,
        sc_ptr=sc_ptr,
        scbase=scbase,
        sc_strides=sc_strides,
        NC=NC,
        Q0=0,
        NP=P0,
        D=D,
        NORM=NORM,
        ROPE=ROPE,
        ROUND_NORM=ROUND_NORM,
        MASKED=MASK0,
        ACT=ACT,
        QUANT=QUANT,
    )
    if P1 > 0:
        _finish_pairs(
            u1,
            p1,
            l1,
            mean,
            rstd,
            alpha,
            o_ptr,
            obase,
            w_ptr=w_ptr,
            b_ptr=b_ptr,
            row=row,
            sc_ptr=sc_ptr,
            scbase=scbase,
            sc_strides=sc_strides,
            NC=NC,
            Q0=P0,
            NP=P1,
            D=D,
            NORM=NORM,
            ROPE=ROPE,
            ROUND_NORM=ROUND_NORM,
            MASKED=MASK1,
            ACT=ACT,
            QUANT=QUANT,
        )


@jit
def _pairs_program(
    q_ptr,
    qo_ptr,
    k_ptr,
    ko_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    qw_ptr,
    qb_ptr,
    qa_ptr,
    kw_ptr,
    kb_ptr,
    ka_ptr,
    q_scale_ptr,
    k_scale_ptr,
    b,
    s,
    NC,
    scbase,
    q_args,
    k_args,
    q_strides,
    qo_strides,
    k_strides,
    ko_strides,
    cos_strides,
    sin_strides,
    pos_strides,
    scale_strides,
    D: tl.constexpr,
    N0: tl.constexpr,
    N1: tl.constexpr,
    MASK0: tl.constexpr,
    MASK1: tl.constexpr,
    NORM: tl.constexpr,
    ROPE: tl.constexpr,
    ROUND_NORM: tl.constexpr,
    QUANT: tl.constexpr,
):
    """Program (token, 0) does the token's Q, (token, 1) its K, in the pair form (the flat
    kernel with PAIRS, which the launcher sets only with Q and K in programs of their own
    and norms of one body: one set of norm flags here, Q's)."""
    P1: tl.constexpr = N1 // 2
    p0, l0 = _pairs_piece(0, N0 // 2, NC // 2)
    p1 = p0
    l1 = l0
    if P1 > 0:
        p1, l1 = _pairs_piece(N0 // 2, P1, NC // 2)
    row = _table_row(
        cos_ptr, sin_ptr, pos_ptr, b, s, cos_strides, sin_strides, pos_strides, ROPE=ROPE
    )
    ACT: tl.constexpr = q_ptr.dtype.element_ty
    qbase = b * q_strides[0] + s * q_strides[1]
    kbase = b * k_strides[0] + s * k_strides[1]
    qobase = b * qo_strides[0] + s * qo_strides[1]
    kobase = b * ko_strides[0] + s * ko_strides[1]
    # one body on the operands selected by the program's axis (the launcher's
    # ``_same_body``): one copy of the body is faster than two (docs/design/qk_norm_rope.md)
    isq = tl.program_id(1) == 0
    x_ptr = tl.where(isq, q_ptr, k_ptr)
    xbase = tl.where(isq, qbase, kbase)
    u0 = _load_words(x_ptr, xbase, p0, l0, MASK0)
    u1 = u0
    if P1 > 0:
        u1 = _load_words(x_ptr, xbase, p1, l1, MASK1)
    # (the operands selected in the order the body's first use of each wants them)
    o_ptr = tl.where(isq, qo_ptr, ko_ptr)
    obase = tl.where(isq, qobase, kobase)
    w_ptr = tl.where(isq, qw_ptr, kw_ptr)
    b_ptr = tl.where(isq, qb_ptr, kb_ptr)
    a_ptr = tl.where(isq, qa_ptr, ka_ptr)
    args = NormArgs(
        tl.where(isq, q_args.alpha, k_args.alpha),
        tl.where(isq, q_args.eps, k_args.eps),
        tl.where(isq, q_args.n, k_args.n),
    )
    sc_ptr = tl.where(isq, q_scale_ptr, k_scale_ptr)
    _pairs_tensor(
        u0,
        u1,
        p0,
        l0,
        p1,
        l1,
        o_ptr,
        obase,
        w_ptr=w_ptr,
        b_ptr=b_ptr,
        a_ptr=a_ptr,
        args=args,
        row=row,
        sc_ptr=sc_ptr,
        scbase=scbase,
        sc_strides=scale_strides,
        NC=NC,
        D=D,
        P0=N0 // 2,
        P1=P1,
        MASK0=MASK0,
        MASK1=MASK1,
        NORM=NORM,
        ROPE=ROPE,
        ROUND_NORM=ROUND_NORM,
        ACT=ACT,
        QUANT=QUANT,
    )


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
    if PAIRS:
        tl.static_assert(SPLIT_QK and HAS_K, "the pair form runs Q and K in programs of their own")
        _pairs_program(
            q_ptr,
            qo_ptr,
            k_ptr,
            ko_ptr,
            cos_ptr,
            sin_ptr,
            pos_ptr,
            qw_ptr=qw_ptr,
            qb_ptr=qb_ptr,
            qa_ptr=qa_ptr,
            kw_ptr=kw_ptr,
            kb_ptr=kb_ptr,
            ka_ptr=ka_ptr,
            q_scale_ptr=q_scale_ptr,
            k_scale_ptr=k_scale_ptr,
            b=b,
            s=s,
            NC=NC,
            scbase=scbase,
            q_args=NormArgs(q_alpha, q_eps, q_n),
            k_args=NormArgs(k_alpha, k_eps, k_n),
            q_strides=q_strides,
            qo_strides=qo_strides,
            k_strides=k_strides,
            ko_strides=ko_strides,
            cos_strides=cos_strides,
            sin_strides=sin_strides,
            pos_strides=pos_strides,
            scale_strides=scale_strides,
            D=D,
            N0=N0,
            N1=N1,
            MASK0=MASK0,
            MASK1=MASK1,
            NORM=Q_NORM,
            ROPE=ROPE,
            ROUND_NORM=ROUND_NORM,
            QUANT=QUANT,
        )
        return
    c0, l0 = _piece(0, N0, NC)
    c1 = c0
    l1 = l0
    if N1 > 0:
        c1, l1 = _piece(N0, N1, NC)

    row = _table_row(
        cos_ptr, sin_ptr, pos_ptr, b, s, cos_strides, sin_strides, pos_strides, ROPE=ROPE
    )

    qbase = b * q_strides[0] + s * q_strides[1]
    kbase = b * k_strides[0] + s * k_strides[1]
    if SPLIT_QK:  # program (token, 0) does Q, (token, 1) K: half the live values a program
        if tl.program_id(1) == 0:
            qobase = b * qo_strides[0] + s * qo_strides[1]
            _one_tensor(
                q_ptr,
                qbase,
                q_strides,
                c0,
                l0,
                c1,
                l1,
                qo_ptr,
                obase=qobase,
                o_strides=qo_strides,
                w_ptr=qw_ptr,
                b_ptr=qb_ptr,
                a_ptr=qa_ptr,
                args=NormArgs(q_alpha, q_eps, q_n),
                row=row,
                sc_ptr=q_scale_ptr,
                scbase=scbase,
                sc_strides=scale_strides,
                NC=NC,
                D=D,
                N0=N0,
                N1=N1,
                MASK0=MASK0,
                MASK1=MASK1,
                NORM=Q_NORM,
                ROPE=ROPE,
                ROUND_NORM=ROUND_NORM,
                ROW_CONTIG=ROW_CONTIG,
                QUANT=QUANT,
            )
        else:
            kobase = b * ko_strides[0] + s * ko_strides[1]
            _one_tensor(
                k_ptr,
                kbase,
                k_strides,
                c0,
                l0,
                c1,
                l1,
                ko_ptr,
                obase=kobase,
                o_strides=ko_strides,
                w_ptr=kw_ptr,
                b_ptr=kb_ptr,
                a_ptr=ka_ptr,
                args=NormArgs(k_alpha, k_eps, k_n),
                row=row,
                sc_ptr=k_scale_ptr,
                scbase=scbase,
                sc_strides=scale_strides,
                NC=NC,
                D=D,
                N0=N0,
                N1=N1,
                MASK0=MASK0,
                MASK1=MASK1,
                NORM=K_NORM,
                ROPE=ROPE,
                ROUND_NORM=ROUND_NORM,
                ROW_CONTIG=ROW_CONTIG,
                QUANT=QUANT,
            )
    else:
        # both tensors' loads before the first store (a store to Q may alias K for the
        # compiler: one memory latency a program, not two)
        q0 = _load_piece(q_ptr, qbase, c0, l0, q_strides, D, ROW_CONTIG, MASK0)
        q1 = 0.0
        if N1 > 0:
            q1 = _load_piece(q_ptr, qbase, c1, l1, q_strides, D, ROW_CONTIG, MASK1)
        if HAS_K:
            k0 = _load_piece(k_ptr, kbase, c0, l0, k_strides, D, ROW_CONTIG, MASK0)
            k1 = 0.0
            if N1 > 0:
                k1 = _load_piece(k_ptr, kbase, c1, l1, k_strides, D, ROW_CONTIG, MASK1)
        _flat_tensor(
            q0,
            q1,
            c0,
            l0,
            c1,
            l1,
            qo_ptr,
            b * qo_strides[0] + s * qo_strides[1],
            o_strides=qo_strides,
            w_ptr=qw_ptr,
            b_ptr=qb_ptr,
            a_ptr=qa_ptr,
            args=NormArgs(q_alpha, q_eps, q_n),
            row=row,
            sc_ptr=q_scale_ptr,
            scbase=scbase,
            sc_strides=scale_strides,
            NC=NC,
            D=D,
            N0=N0,
            N1=N1,
            MASK0=MASK0,
            MASK1=MASK1,
            NORM=Q_NORM,
            ROPE=ROPE,
            ROUND_NORM=ROUND_NORM,
            ROW_CONTIG=ROW_CONTIG,
            ACT=q_ptr.dtype.element_ty,
            QUANT=QUANT,
        )
        if HAS_K:
            _flat_tensor(
                k0,
                k1,
                c0,
                l0,
                c1,
                l1,
                ko_ptr,
                b * ko_strides[0] + s * ko_strides[1],
                o_strides=ko_strides,
                w_ptr=kw_ptr,
                b_ptr=kb_ptr,
                a_ptr=ka_ptr,
                args=NormArgs(k_alpha, k_eps, k_n),
                row=row,
                sc_ptr=k_scale_ptr,
                scbase=scbase,
                sc_strides=scale_strides,
                NC=NC,
                D=D,
                N0=N0,
                N1=N1,
                MASK0=MASK0,
                MASK1=MASK1,
                NORM=K_NORM,
                ROPE=ROPE,
                ROUND_NORM=ROUND_NORM,
                ROW_CONTIG=ROW_CONTIG,
                ACT=k_ptr.dtype.element_ty,
                QUANT=QUANT,
            )
