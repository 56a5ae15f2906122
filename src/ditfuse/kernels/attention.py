"""The Triton kernel of sliding-window (and differential) attention (private; the launch
table, the launcher and the public function are in :mod:`ditfuse.ops.attention`; design and
measurements: docs/design/attention.md).

One program computes one tile of BLOCK_M queries of one (batch, head) and stores the first
STEP_M of them (fewer where that saves a key tile: ``attention.query_step``), flash-attention
style (online softmax, fp32 running max / sum, the probabilities rescaled with exp2 of
log2(e)-scaled scores), over only the key tiles that intersect the band

    i - LEFT <= j <= i + RIGHT    (FlashAttention's window_size=(left, right))

of its queries: key tiles from ``max(0, start_m - LEFT)`` (the tile's first key, not
aligned to BLOCK_N) up to ``min(N, start_m + STEP_M + RIGHT)``, masked per element (band and
``j < N``). Both matrix products run on tensor cores (``tl.dot``): bf16/fp16 operands (the
probabilities are rounded to the input dtype before P @ V, as FlashAttention does) or, for
fp32 inputs, tf32 operands; fp32 accumulation throughout.

Differential mode (``DIFF``): a second query/key pair shares the V tile, which is loaded
once per key tile and multiplied by both probability tiles; the output is
``acc1 * (1 / l1) - acc2 * (lambda * (1 / l2))`` in fp32 (per-row reciprocals, one multiply
and one fma an element), rounded once at the store.

Prologue (``Q_NORM`` / ``K_NORM`` / ``ROPE``): each Q/K tile is normalised per head (RMS,
LayerNorm or Dynamic-Tanh), rounded to the activation dtype, rotated (rotate-half or
interleaved pairs over the first ``R`` channels) and rounded again, with exactly the
arithmetic of ``ditfuse.qk_norm_rope`` (its helpers; the launcher turns fp contraction off
when the prologue is on, as qk_norm_rope does). With RoPE a tile is held as qk_norm_rope
holds it -- the a and b channel of every rotary pair and the pass-through channels, three
pieces -- and the scores are the sum of one dot per piece, so the rotation needs neither
a register shuffle nor a second load. K tiles go through the prologue once per query tile
that visits them (about twice at SAME's window).

Loop: ``range(lo, hi, BLOCK_N)`` on the GPU (software-pipelined); under Triton's
interpreter the same tiles in the same order as a ``while`` loop (the interpreter's
scalars are 1-element arrays that numpy >= 2.3 will not turn into range bounds).

Arguments: a tensor travels with its (b, s, h, d) strides as one tuple, and the helpers
read one (batch, head)'s slice of it as a :class:`HeadRows`; a norm's compile-time
description is a :class:`~ditfuse.kernels.common.NormFlags`, its run-time scalars a
:class:`~ditfuse.kernels.common.NormArgs`, the rotation's a
:class:`~ditfuse.kernels.common.RopeFlags`. Tiles are as wide as the head dim padded to a
power of two >= 16 (``_tile``).

Offsets: every tile's base (batch, head, first row) is an int64 scalar; offsets inside a
tile are int32 unless ``OFF64`` (strides so large that BLOCK * stride could pass 2^31).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import triton
import triton.language as tl

from ditfuse.kernels.common import (
    LAYER,
    NO_NORM,
    RMS,
    NormFlags,
    RopeFlags,
    _alpha,
    _norm_affine,
)
from ditfuse.kernels.element import _cast_out, _ex2, _rnd
from ditfuse.runtime.backend import INTERPRET, jit

# Triton's interpreter multiplies fp32 operands of tl.dot exactly; the GPU's tf32 tensor
# cores drop the low 13 bits of each operand. Under the interpreter the operands are
# truncated the same way, so CPU results carry the GPU's tf32 error.
_SOFT_TF32 = tl.constexpr(INTERPRET)
_INTERP_LOOP = tl.constexpr(INTERPRET)


@triton.constexpr_function
def _tile(n):
    """``n`` channels padded to a power of two >= 16 (a dot's least K; the launcher's
    ``tile_dim``)."""
    return max(16, triton.next_power_of_2(n))


class HeadRows(NamedTuple):
    """One (batch, head)'s (N, D) slice of a (B, N, H, D) tensor, as the helpers read it:
    the tensor, the slice's int64 element offset, its token and channel strides."""

    ptr: Any
    base: Any
    stride_s: Any
    stride_d: Any


class NormPtrs(NamedTuple):
    """A norm's tensors: weight, bias and DyT's alpha (the query itself where absent)."""

    w: Any
    b: Any
    alpha: Any


class TileFlags(NamedTuple):
    """How ``_swa_fwd_kernel`` compiles its Q / K / V tiles (``T``: a constexpr its helpers
    share)."""

    d: int  # head_dim (tiles padded to a power of two >= 16)
    r: int  # rotary channels (rope.on), even, <= d
    rope: RopeFlags
    act: Any  # the activation dtype
    off64: bool  # int64 offsets inside a tile
    prec: str  # fp32 products: "tf32" or "tf32x3"
    block_n: int  # keys a tile
    diff: bool  # two attention maps (differential)
    split_pv: bool  # P @ V and the output as two halves of the padded columns
    k_norm: NormFlags


@triton.constexpr_function
def _tile_flags(d, r, rope, act, off64, prec, block_n, diff, split_pv, k_norm):
    # the flags rebuilt: under the interpreter a NamedTuple argument arrives as a plain tuple
    return TileFlags(
        d, r, RopeFlags(*rope), act, off64, prec, block_n, diff, split_pv, NormFlags(*k_norm)
    )


@jit
def _head_rows(ptr, strides, b, h):
    """The :class:`HeadRows` of batch ``b``, head ``h`` of a tensor with (b, s, h, d)
    ``strides``."""
    return HeadRows(ptr, b * strides[0] + h * strides[2], strides[1], strides[3])


@jit
def _as_tf32(x):
    """fp32 ``x`` as the tensor cores read it in tf32 mode (interpreter only; identity on
    the GPU, where the mma instruction itself ignores the low mantissa bits)."""
    if _SOFT_TF32:
        u = x.to(tl.uint32, bitcast=True) & 0xFFFFE000
        return u.to(tl.float32, bitcast=True)
    else:
        return x


@jit
def _dot_operand(x, T: tl.constexpr):
    """A tile as a tensor-core operand: in the activation dtype ``T.act`` (fp32 values such
    as the probabilities rounded to nearest even); fp32 activations as tf32 (``T.prec ==
    "tf32"``) or whole (``"tf32x3"``: each operand split into two tf32 terms, three
    products)."""
    if T.act == tl.float32:
        if T.prec == "tf32":
            return _as_tf32(x.to(tl.float32))
        else:
            return x.to(tl.float32)
    elif _SOFT_TF32:
        # the interpreter keeps bf16 as raw uint16 bits, which its matmul cannot read: the
        # operand stays fp32 holding exactly the (rounded) value of the input dtype
        return _rnd(x.to(tl.float32), T.act)
    else:
        return x.to(T.act)


@jit
def _tile_ptrs(x, start, cols, BLOCK: tl.constexpr, OFF64: tl.constexpr):
    """Pointers of rows ``start .. start + BLOCK`` and columns ``cols`` of the slice ``x``
    (:class:`HeadRows`); the tile's first row is added in int64."""
    r = tl.arange(0, BLOCK)
    if OFF64:
        r = r.to(tl.int64)
        cols = cols.to(tl.int64)
    row0 = x.base + start.to(tl.int64) * x.stride_s
    return x.ptr + row0 + (r * x.stride_s)[:, None] + (cols * x.stride_d)[None, :]


@jit
def _cols_mask(rmask, cmask, D: tl.constexpr):
    """Rows ``rmask`` x columns ``cmask`` as a load / store mask; the column test only where
    the head dim is padded, so power-of-two head dims build as before."""
    if _tile(D) == D:
        return rmask[:, None]
    else:
        return rmask[:, None] & cmask[None, :]


@jit
def _load_cols(x, start, rmask, cols, cmask, BLOCK: tl.constexpr, OFF64: tl.constexpr):
    """Columns ``cols`` of rows ``start .. start + BLOCK`` of ``x`` as fp32, zero where
    masked."""
    m = rmask[:, None] & cmask[None, :]
    t = tl.load(_tile_ptrs(x, start, cols, BLOCK, OFF64), mask=m, other=0.0)
    return t.to(tl.float32), m


@jit
def _norm_piece(x, m, norm, cols, cmask, mean, rstd, alpha, NORM: tl.constexpr, ACT: tl.constexpr):
    """Normalise one piece (channels ``cols``) with the norm ``NORM`` (:class:`NormFlags`;
    its tensors ``norm``: :class:`NormPtrs`), rounded to the activation dtype; zero in
    padding columns (a DyT bias would otherwise leak into the scores)."""
    w = 1.0
    b = 0.0
    if NORM.has_w:
        w = tl.load(norm.w + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    if NORM.has_b:
        b = tl.load(norm.b + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    y = _norm_affine(x, w, b, mean, rstd, alpha, NORM=NORM, ACT=ACT)
    return tl.where(m, _rnd(y, ACT), 0.0)


@jit
def _load_qk(x, start, rmask, norm, rope, BLOCK: tl.constexpr, NORM: tl.constexpr, T: tl.constexpr):
    """A Q or K tile of BLOCK rows of ``x`` (:class:`HeadRows`), ready for tl.dot: [norm ->
    round] [-> rotate -> round]. ``NORM``: :class:`NormFlags` (``norm``: its tensors'
    :class:`NormPtrs` and its :class:`NormArgs`); ``T.rope``: :class:`RopeFlags` over the
    first ``T.r`` channels, ``rope``: the (cos, sin) tables' :class:`HeadRows`.

    Without RoPE: one [BLOCK, D padded] tile, zero in the columns past D (and two unused
    zeros). With RoPE: three pieces, as ``qk_norm_rope`` holds them: the a and b channels of
    every rotary pair, [BLOCK, R / 2 padded] each, and the pass-through channels [BLOCK,
    D - R padded] (zero-width when R == D). The scores are then the sum of three dots,
    q_a.k_a + q_b.k_b + q_p.k_p: the rotation needs no register shuffle and no channel is
    loaded twice.
    """
    ptrs, args = norm
    cos, sin = rope
    alpha = _alpha(ptrs.alpha, args.alpha, NORM.kind, NORM.alpha_ptr)
    if not T.rope.on:
        D_PAD: tl.constexpr = _tile(T.d)
        d = tl.arange(0, D_PAD)
        dm = d < T.d
        if NORM.kind == NO_NORM:
            v = tl.load(
                _tile_ptrs(x, start, d, BLOCK, T.off64), mask=_cols_mask(rmask, dm, T.d), other=0.0
            )
            return _dot_operand(v, T), 0.0, 0.0
        v, m = _load_cols(x, start, rmask, d, dm, BLOCK, T.off64)
        mean = 0.0
        rstd = 1.0
        if NORM.kind == LAYER:
            mean = (tl.sum(v, 1) / T.d)[:, None]
            xc = v - mean
            if D_PAD != T.d:  # padding columns hold 0, not the mean
                xc = tl.where(m, xc, 0.0)
            rstd = (1.0 / tl.sqrt(tl.sum(xc * xc, 1) / T.d + args.eps))[:, None]
        elif NORM.kind == RMS:
            rstd = (1.0 / tl.sqrt(tl.sum(v * v, 1) / T.d + args.eps))[:, None]
        y = _norm_piece(v, m, ptrs, d, dm, mean, rstd, alpha, NORM=NORM, ACT=T.act)
        return _dot_operand(y, T), 0.0, 0.0
    else:
        R2: tl.constexpr = T.r // 2
        P: tl.constexpr = T.d - T.r
        i = tl.arange(0, _tile(R2))
        im = i < R2
        if T.rope.interleaved:  # pairs (2i, 2i+1)
            ca_col = 2 * i
            cb_col = 2 * i + 1
        else:  # rotate-half: pairs (i, i + R/2)
            ca_col = i
            cb_col = i + R2
        xa, ma = _load_cols(x, start, rmask, ca_col, im, BLOCK, T.off64)
        xb, mb = _load_cols(x, start, rmask, cb_col, im, BLOCK, T.off64)
        j = T.r + tl.arange(0, _tile(P))
        jm = j < T.d
        xp = 0.0
        if P > 0:
            xp, mp = _load_cols(x, start, rmask, j, jm, BLOCK, T.off64)
        if NORM.kind != NO_NORM:
            mean = 0.0
            rstd = 1.0
            if NORM.kind == LAYER:
                tot = tl.sum(xa, 1) + tl.sum(xb, 1)
                if P > 0:
                    tot += tl.sum(xp, 1)
                mean = (tot / T.d)[:, None]
            if NORM.kind == RMS or NORM.kind == LAYER:
                da = tl.where(ma, xa - mean, 0.0)
                db = tl.where(mb, xb - mean, 0.0)
                sq = tl.sum(da * da, 1) + tl.sum(db * db, 1)
                if P > 0:
                    dp = tl.where(mp, xp - mean, 0.0)
                    sq += tl.sum(dp * dp, 1)
                rstd = (1.0 / tl.sqrt(sq / T.d + args.eps))[:, None]
            xa = _norm_piece(xa, ma, ptrs, ca_col, im, mean, rstd, alpha, NORM=NORM, ACT=T.act)
            xb = _norm_piece(xb, mb, ptrs, cb_col, im, mean, rstd, alpha, NORM=NORM, ACT=T.act)
            if P > 0:
                xp = _norm_piece(xp, mp, ptrs, j, jm, mean, rstd, alpha, NORM=NORM, ACT=T.act)
        # cos/sin of the a and b channel of each pair (a half-width table: one column each)
        if T.rope.table_half:
            ta_col = i
            tb_col = i
        else:
            ta_col = ca_col
            tb_col = cb_col
        c_a, _ = _load_cols(cos, start, rmask, ta_col, im, BLOCK, T.off64)
        s_a, _ = _load_cols(sin, start, rmask, ta_col, im, BLOCK, T.off64)
        if T.rope.table_half:
            c_b = c_a
            s_b = s_a
        else:
            c_b, _ = _load_cols(cos, start, rmask, tb_col, im, BLOCK, T.off64)
            s_b, _ = _load_cols(sin, start, rmask, tb_col, im, BLOCK, T.off64)
        # eager: x * cos + rotate_half(x) * sin, no fused multiply-add (qk_norm_rope's order)
        oa = _rnd(xa * c_a - xb * s_a, T.act)
        ob = _rnd(xb * c_b + xa * s_b, T.act)
        return (
            _dot_operand(oa, T),
            _dot_operand(ob, T),
            _dot_operand(xp, T),
        )


@jit
def _scores(q, k, T: tl.constexpr):
    """Raw scores q . k over all channels: one dot, or one per piece (RoPE); ``q``, ``k``:
    the (a, b, pass-through) pieces of :func:`_load_qk`."""
    s = tl.dot(q[0], tl.trans(k[0]), input_precision=T.prec)
    if T.rope.on:
        s = tl.dot(q[1], tl.trans(k[1]), s, input_precision=T.prec)
        if T.r < T.d:
            s = tl.dot(q[2], tl.trans(k[2]), s, input_precision=T.prec)
    return s


@jit
def _softmax_step(s, band, m_i, l_i, qk_scale):
    """One online-softmax step on raw scores ``s`` [BM, BN]: returns the unnormalised
    probabilities, the accumulator's rescale factor and the new running max / sum. exp2 is
    one ``ex2.approx.ftz`` on the GPU (``_ex2``): a probability below 2^-126 of the row's
    running max counts as 0, which no rounded output can see. The running max starts at
    -FLT_MAX, not -inf: a row with no key in the band yet keeps a finite max (its masked
    scores give p = 2^-inf = 0, alpha = 1 on an accumulator of 0) and its first key's
    score s >= -FLT_MAX gives alpha = 2^(-FLT_MAX - s) = 0 (or 2^-inf), as -inf would --
    the same bits without a test of the max for -inf a row and trip."""
    s = tl.where(band, s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = _ex2(m_i - m_new)
    p = _ex2(s - m_new[:, None])
    l_new = l_i * alpha + tl.sum(p, 1)
    return p, alpha, m_new, l_new


@jit
def _key_tile(start_n, map1, map2, query, keys, qk_scale, N, T: tl.constexpr):
    """One key tile: scores, online-softmax update and P @ V for one or both maps (``T``:
    :class:`TileFlags`). ``map1``, ``map2``: each map's running state (max, sum,
    accumulator, its second half under ``T.split_pv``), returned updated; ``query``: the query
    tiles' pieces and each row's band (q1, q2, row_lo, row_span); ``keys``: the (batch,
    head)'s :class:`HeadRows` k, k2, v, the K norm (its :class:`NormPtrs`,
    :class:`NormArgs`) and the (cos, sin) tables."""
    m1, l1, acc1, acc1b = map1
    m2, l2, acc2, acc2b = map2
    q1, q2, row_lo, row_span = query
    k, k2, v, k_norm, rope = keys
    D_PAD: tl.constexpr = _tile(T.d)
    offs_n = start_n + tl.arange(0, T.block_n)
    kmask = offs_n < N
    # lo_i <= j <= hi_i as one unsigned compare an element: j - lo_i in [0, span_i], taken
    # as c - (lo_i - start_n) on the tile's column c (a subtraction a row, not an element)
    band = (tl.arange(0, T.block_n)[None, :] - (row_lo - start_n)[:, None]).to(
        tl.uint32, bitcast=True
    ) <= row_span[:, None].to(tl.uint32, bitcast=True)
    K_NORM: tl.constexpr = T.k_norm
    k1t = _load_qk(k, start_n, kmask, k_norm, rope, T.block_n, K_NORM, T)
    s1 = _scores(q1, k1t, T)
    p1, a1, m1, l1 = _softmax_step(s1, band, m1, l1, qk_scale)
    if T.diff:
        k2t = _load_qk(k2, start_n, kmask, k_norm, rope, T.block_n, K_NORM, T)
        s2 = _scores(q2, k2t, T)
        p2, a2, m2, l2 = _softmax_step(s2, band, m2, l2, qk_scale)
    # V: one load per key tile, shared by both attention maps
    if T.split_pv:
        # P @ V as two dots of D_PAD / 2 columns (the same products and sums a column):
        # Triton gives a chain of mma.sync dots the warps of one of them, and a [BLOCK_M,
        # D_PAD] product with BLOCK_M < D_PAD would split its columns across the warps
        # (every softmax row reduction and P's operand through shared memory); halves with
        # BLOCK_M >= D_PAD / 2 put the warps along the query rows, 16 rows each
        DH: tl.constexpr = D_PAD // 2
        dd = tl.arange(0, DH)
        va = tl.load(
            _tile_ptrs(v, start_n, dd, T.block_n, T.off64),
            mask=_cols_mask(kmask, dd < T.d, T.d),
            other=0.0,
        )
        vb = tl.load(
            _tile_ptrs(v, start_n, dd + DH, T.block_n, T.off64),
            mask=_cols_mask(kmask, dd + DH < T.d, T.d),
            other=0.0,
        )
        va = _dot_operand(va, T)
        vb = _dot_operand(vb, T)
        pp1 = _dot_operand(p1, T)
        acc1 = acc1 * a1[:, None] + tl.dot(pp1, va, input_precision=T.prec)
        acc1b = acc1b * a1[:, None] + tl.dot(pp1, vb, input_precision=T.prec)
        if T.diff:
            pp2 = _dot_operand(p2, T)
            acc2 = acc2 * a2[:, None] + tl.dot(pp2, va, input_precision=T.prec)
            acc2b = acc2b * a2[:, None] + tl.dot(pp2, vb, input_precision=T.prec)
    else:
        dd = tl.arange(0, D_PAD)
        vt = tl.load(
            _tile_ptrs(v, start_n, dd, T.block_n, T.off64),
            mask=_cols_mask(kmask, dd < T.d, T.d),
            other=0.0,
        )
        vt = _dot_operand(vt, T)
        acc1 = acc1 * a1[:, None] + tl.dot(_dot_operand(p1, T), vt, input_precision=T.prec)
        if T.diff:
            acc2 = acc2 * a2[:, None] + tl.dot(_dot_operand(p2, T), vt, input_precision=T.prec)
    return (m1, l1, acc1, acc1b), (m2, l2, acc2, acc2b)


@jit
def _store_out(
    o,
    start_m,
    cols,
    smask,
    acc1,
    r1,
    acc2,
    c2,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    DIFF: tl.constexpr,
    OFF64: tl.constexpr,
):
    """``acc1 * r1 - acc2 * c2`` (or ``acc1 * r1``) for columns ``cols`` of the stored rows of
    ``o`` (:class:`HeadRows`), rounded once to the output dtype; ``r1 = 1 / l1`` and ``c2 =
    lambda / l2`` are per-row factors, so an element costs a multiply and a fused
    multiply-add instead of two divisions (each a reciprocal, a multiply and two range
    checks in ``div.full.f32``)."""
    out = acc1 * r1[:, None]
    if DIFF:
        out = tl.fma(acc2, -c2[:, None], out)
    o_ptrs = _tile_ptrs(o, start_m, cols, BLOCK_M, OFF64)
    tl.store(o_ptrs, _cast_out(out, o.ptr.dtype.element_ty), mask=_cols_mask(smask, cols < D, D))


@jit
def _swa_fwd_kernel(
    q_ptr,
    k_ptr,
    v_ptr,  # (B, N, H, D) views, any strides
    q2_ptr,
    k2_ptr,  # second query/key (DIFF), same shape
    o_ptr,  # output (B, N, H, D) view
    lam_ptr,  # per-head lambda (LAM_PTR), any float dtype
    qw_ptr,
    qb_ptr,
    qa_ptr,  # Q norm weight, bias, DyT alpha tensor (Q_NORM)
    kw_ptr,
    kb_ptr,
    ka_ptr,  # K norm weight, bias, DyT alpha tensor (K_NORM)
    cos_ptr,
    sin_ptr,  # rotary tables, (B, N, H, W) broadcast views (ROPE)
    lam,  # lambda as a Python float (not LAM_PTR)
    qk_scale,  # softmax scale * log2(e)
    q_args,
    k_args,  # NormArgs: each norm's (DyT alpha as a float, eps, n)
    N,
    LEFT,
    RIGHT,  # tokens; the band's sides (unbounded ones passed as N)
    q_strides,
    k_strides,
    v_strides,  # (b, s, h, d) strides of each tensor
    q2_strides,
    k2_strides,
    o_strides,
    lam_stride,
    cos_strides,
    sin_strides,  # (b, s, h, w)
    H: tl.constexpr,  # heads (a constant: bh // H and bh % H by multiplies)
    D: tl.constexpr,  # head_dim (1 .. 128; tiles padded to a power of two >= 16,
    # columns past D load 0 and are not stored)
    R: tl.constexpr,  # rotary channels (ROPE), even, <= D
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    STEP_M: tl.constexpr,  # queries a program stores (<= BLOCK_M; see attention.query_step)
    MMA_SYNC: tl.constexpr,  # compiled with mma.sync instead of wgmma: read by no code, it
    # keeps that build's cache entry apart (the one environment
    # toggle: ditfuse.runtime.backend.mma_sync_only)
    SPLIT_PV: tl.constexpr,  # P @ V and the output as two halves of the padded columns (the
    # warps of a multi-warp mma.sync tile along its rows)
    DIFF: tl.constexpr,  # differential: out = Attn(q, k, v) - lambda * Attn(q2, k2, v)
    LAM_PTR: tl.constexpr,
    Q_NORM: tl.constexpr,
    K_NORM: tl.constexpr,  # NormFlags
    ROPE: tl.constexpr,  # RopeFlags
    OFF64: tl.constexpr,
    TOKEN_MAJOR: tl.constexpr,  # grid (B*H, query tiles) rather than (query tiles, B*H)
    PREC: tl.constexpr = "tf32",  # fp32 products: "tf32", or "tf32x3" (fp32-accurate, 3 mma)
):
    ACT: tl.constexpr = q_ptr.dtype.element_ty
    T: tl.constexpr = _tile_flags(D, R, ROPE, ACT, OFF64, PREC, BLOCK_N, DIFF, SPLIT_PV, K_NORM)
    D_PAD: tl.constexpr = _tile(D)
    # programs start in grid order, axis 0 fastest. TOKEN_MAJOR: the programs running
    # together hold every head of a few query tiles: with heads interleaved in each token's
    # row (bshd), they read whole rows, not one head's 2*D-byte piece of each; the key/value
    # tiles a tile shares with its neighbour are still read by programs only B*H apart.
    # Else query tiles of one (batch, head) consecutive (bhsd: one head's rows contiguous).
    # (Axis 0 read first either way: the order of the reads moves the sm_90 schedule.)
    if TOKEN_MAJOR:
        bh = tl.program_id(0)
    start_m = tl.program_id(1 if TOKEN_MAJOR else 0) * STEP_M
    if not TOKEN_MAJOR:
        bh = tl.program_id(1)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    qmask = offs_m < N
    rope = (_head_rows(cos_ptr, cos_strides, b, h), _head_rows(sin_ptr, sin_strides, b, h))
    q_norm = (NormPtrs(qw_ptr, qb_ptr, qa_ptr), q_args)
    k_norm = (NormPtrs(kw_ptr, kb_ptr, ka_ptr), k_args)

    q1 = _load_qk(
        _head_rows(q_ptr, q_strides, b, h), start_m, qmask, q_norm, rope, BLOCK_M, Q_NORM, T
    )
    m1 = tl.full([BLOCK_M], -3.4028234663852886e38, tl.float32)  # -FLT_MAX: _softmax_step
    l1 = tl.zeros([BLOCK_M], tl.float32)
    ACC_W: tl.constexpr = D_PAD // 2 if SPLIT_PV else D_PAD
    acc1 = tl.zeros([BLOCK_M, ACC_W], tl.float32)
    acc1b = 0.0
    if SPLIT_PV:
        acc1b = tl.zeros([BLOCK_M, ACC_W], tl.float32)
    q2 = (0.0, 0.0, 0.0)
    m2 = 0.0
    l2 = 0.0
    acc2 = 0.0
    acc2b = 0.0
    if DIFF:
        q2 = _load_qk(
            _head_rows(q2_ptr, q2_strides, b, h), start_m, qmask, q_norm, rope, BLOCK_M, Q_NORM, T
        )
        m2 = tl.full([BLOCK_M], -3.4028234663852886e38, tl.float32)
        l2 = tl.zeros([BLOCK_M], tl.float32)
        acc2 = tl.zeros([BLOCK_M, ACC_W], tl.float32)
        if SPLIT_PV:
            acc2b = tl.zeros([BLOCK_M, ACC_W], tl.float32)

    k = _head_rows(k_ptr, k_strides, b, h)
    k2 = _head_rows(k2_ptr, k2_strides, b, h)
    v = _head_rows(v_ptr, v_strides, b, h)

    # only the keys of the band of this query tile, in BLOCK_N tiles from its first key
    # (not aligned to BLOCK_N: 64 queries at window 17 span 98 keys, two 64-key trips
    # where aligned tiles would take three)
    # A program stores STEP_M of its BLOCK_M query rows: where BLOCK_M + LEFT + RIGHT keys
    # pass a multiple of BLOCK_N by a few (SAME's 64 + 34 = 98 = 3 x 32 + 2), a step of 62
    # queries spans 3 key tiles instead of 4. The rows past the step are the next program's
    # queries: computed on the keys loaded here (finite), never stored.
    lo = tl.maximum(start_m - LEFT, 0)
    hi = tl.minimum(start_m + STEP_M + RIGHT, N)
    # each query row's band [i - LEFT, min(i + RIGHT, N - 1)] as its first key and width:
    # the key bound j < N folded in (rows past N are never stored; their width may be
    # "negative", any key then counts, and their scores stay finite: K rows past N load 0)
    row_lo = offs_m - LEFT
    row_span = tl.minimum(offs_m + RIGHT, N - 1) - row_lo
    map1 = (m1, l1, acc1, acc1b)
    map2 = (m2, l2, acc2, acc2b)
    query = (q1, q2, row_lo, row_span)
    keys = (k, k2, v, k_norm, rope)
    if _INTERP_LOOP:
        # Triton's interpreter cannot take tensor bounds in range() under numpy >= 2.3 (its
        # scalars are 1-element arrays): the same tiles in the same order, as a while loop
        start_n = lo
        while start_n < hi:
            map1, map2 = _key_tile(start_n, map1, map2, query, keys, qk_scale, N, T)
            start_n += BLOCK_N
    else:
        for start_n in range(lo, hi, BLOCK_N):
            map1, map2 = _key_tile(start_n, map1, map2, query, keys, qk_scale, N, T)
    m1, l1, acc1, acc1b = map1
    m2, l2, acc2, acc2b = map2

    # query rows past N have l = 0; they are not stored. Any other row's sum is >= 1 (its
    # max's own term), so the per-row reciprocals are of normal numbers
    r1 = 1.0 / tl.where(l1 == 0.0, 1.0, l1)
    c2 = 0.0
    if DIFF:
        if LAM_PTR:
            lam_h = tl.load(lam_ptr + h * lam_stride).to(tl.float32)
        else:
            lam_h = lam
        # lam times a reciprocal, not lam / l2: an AOT package binding lam = 1.0 folds the
        # multiply away exactly and computes the JIT kernel's bits
        c2 = lam_h * (1.0 / tl.where(l2 == 0.0, 1.0, l2))
    smask = qmask
    if STEP_M < BLOCK_M:
        smask = qmask & (tl.arange(0, BLOCK_M) < STEP_M)
    o = _head_rows(o_ptr, o_strides, b, h)
    if SPLIT_PV:
        DH: tl.constexpr = D_PAD // 2
        dd = tl.arange(0, DH)
        _store_out(
            o, start_m, dd, smask, acc1, r1, acc2, c2, D=D, BLOCK_M=BLOCK_M, DIFF=DIFF, OFF64=OFF64
        )
        _store_out(
            o,
            start_m,
            dd + DH,
            smask,
            acc1b,
            r1,
            acc2b,
            c2,
            D=D,
            BLOCK_M=BLOCK_M,
            DIFF=DIFF,
            OFF64=OFF64,
        )
    else:
        dd = tl.arange(0, D_PAD)
        _store_out(
            o, start_m, dd, smask, acc1, r1, acc2, c2, D=D, BLOCK_M=BLOCK_M, DIFF=DIFF, OFF64=OFF64
        )
