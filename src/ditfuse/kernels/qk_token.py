"""The per-token Triton kernel of the fused QK-norm + RoPE (private; launched by
:mod:`ditfuse.ops.qk_norm_rope` wherever the flat-row kernel of :mod:`ditfuse.kernels.qk_flat`
does not apply).

One program handles one token and a group of heads of it, for Q and then K:

    load (one read) -> norm statistics (fp32) -> normalise, weight, bias -> [round to the
    activation dtype] -> rotate with the token's cos/sin row -> cast -> store (one write)

The token's cos/sin row is shared by every head (unless the table is per head) and loaded
where the rotation needs it, once per tensor (K's load hits L1): holding it from the start
cost the Wan kernel 36 registers a thread. Offsets within a token are 32-bit, added to the
token's 64-bit base (``OFF64`` when a head stride makes them reach 2^31). A group of heads
is held as at most two power-of-two pieces (40 = 32 + 8, 24 = 16 + 8, 48 = 32 + 16) so
that no lanes are wasted on padding heads. A rotary pair is (a, b): interleaved
(2i, 2i+1), loaded as one contiguous row and split in registers -- or, for aligned 16-bit
rows (the word form, ``X_WORDS``), each pair loaded and stored as one 32-bit word, with
the rows every head shares (per-head weights, a shared table) loaded once and broadcast --
or rotate-half (i, i + r/2), loaded as two contiguous halves; channels past the rotary
width pass through the norm only.

Floating-point contraction is switched off at launch (``enable_fp_fusion=False``) so the
rotation rounds exactly as eager PyTorch does: round(round(a*c) - round(b*s)).

With ``QUANT`` (1: int8, 2: float8 e4m3) the outputs are 8-bit: each head's values, rounded
to the activation dtype as the 16-bit store would round them, share one fp32 scale (their
amax over 127 or 448), stored per (batch, head, token), and are multiplied by its
reciprocal (one IEEE division a head, not a value). A token's heads are
in the program already, so the amax costs no extra pass (docs/qk_norm_rope.md, "8-bit
output"); the 8-bit stores are vectorised no wider than the 16-bit ones (``_same_order``), so
that on the GPU the fp32 sums keep the 16-bit build's register layout, and their order.
"""
from __future__ import annotations

import triton.language as tl

from ditfuse.runtime.backend import jit

from ditfuse.kernels.element import _cast_out, _e4m3_code, _e4m3_rn, _pack, _rnd, _tanh, _unpack


@jit
def _load_words(ptr, i, m):
    """Values (2i, 2i+1) after ``ptr`` as fp32 tiles (a, b): one 32-bit load a pair for
    16-bit values, one 64-bit load for fp32 (``ptr`` aligned to a pair, unit stride)."""
    DT: tl.constexpr = ptr.dtype.element_ty
    if DT.primitive_bitwidth == 16:
        return _unpack(tl.load(ptr.to(tl.pointer_type(tl.uint32)) + i, mask=m, other=0), DT)
    else:
        u = tl.load(ptr.to(tl.pointer_type(tl.uint64)) + i, mask=m, other=0)
        return (u & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True), \
            (u >> 32).to(tl.uint32).to(tl.float32, bitcast=True)


@jit
def _load_row_pairs(ptr, base, stride_d, R2: tl.constexpr, HALF_PAD: tl.constexpr,
                    INTERLEAVED: tl.constexpr, DUP: tl.constexpr, WORDS: tl.constexpr):
    """``_load_pairs`` of one row shared by every head, as [1, HALF_PAD] tiles (interleaved
    pairs or a half-width table: the word form's operands)."""
    tl.static_assert(INTERLEAVED)
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
def _load_pairs(ptr, base, hh, hmask, stride_h, stride_d,
                NH: tl.constexpr, R2: tl.constexpr, HALF_PAD: tl.constexpr,
                INTERLEAVED: tl.constexpr, DUP: tl.constexpr, WORDS: tl.constexpr = False,
                ROW: tl.constexpr = False):
    """Rotary channels of NH heads as (a, b) fp32 tiles of shape [NH, HALF_PAD].

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
    if ROW:
        xa, xb = _load_row_pairs(ptr, base, stride_d, R2, HALF_PAD, INTERLEAVED, DUP, WORDS)
    elif INTERLEAVED and not DUP and WORDS:
        i = tl.arange(0, HALF_PAD)[None, :]
        xa, xb = _load_words(ptr + base + hh * stride_h, i, hmask & (i < R2))
    elif INTERLEAVED and not DUP:
        j = tl.arange(0, 2 * HALF_PAD)[None, :]
        m = hmask & (j < 2 * R2)
        x = tl.load(ptr + base + hh * stride_h + j * stride_d, mask=m,
                    other=0.0).to(tl.float32)
        xa, xb = tl.split(tl.reshape(x, (NH, HALF_PAD, 2)))
    elif DUP:
        # one value a pair, in either rotary style: one [NH, HALF_PAD] load used for both a
        # and b (a per-channel load of duplicated addresses split in registers held twice
        # the values: 127 instead of 64 registers at Qwen-Image's 24 x 128 on sm_90)
        i = tl.arange(0, HALF_PAD)[None, :]
        m = hmask & (i < R2)
        xa = tl.load(ptr + base + hh * stride_h + i * stride_d, mask=m,
                     other=0.0).to(tl.float32)
        xb = xa
    else:
        i = tl.arange(0, HALF_PAD)[None, :]
        m = hmask & (i < R2)
        p = ptr + base + hh * stride_h + i * stride_d
        xa = tl.load(p, mask=m, other=0.0).to(tl.float32)
        xb = tl.load(p + R2 * stride_d, mask=m, other=0.0).to(tl.float32)
    return xa, xb


@jit
def _store_pairs(ptr, base, hh, hmask, stride_h, stride_d, ya, yb,
                 NH: tl.constexpr, R2: tl.constexpr, HALF_PAD: tl.constexpr,
                 INTERLEAVED: tl.constexpr, WORDS: tl.constexpr = False,
                 VEC: tl.constexpr = 0):
    """``VEC`` (the 8-bit store): offsets declared contiguous in runs of VEC only
    (``_same_order``)."""
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
def _load_rope_tables(cos_ptr, sin_ptr, cbase, sbase, hh, hmask, stride_ch, stride_cw,
                      stride_sh, stride_sw, NH: tl.constexpr, R2: tl.constexpr,
                      HALF_PAD: tl.constexpr, INTERLEAVED: tl.constexpr,
                      TABLE_HALF: tl.constexpr, WORDS: tl.constexpr = False,
                      ROW: tl.constexpr = False):
    """cos/sin of the a and b channel of each pair, fp32 [NH, HALF_PAD] tiles. A table
    shared by all heads has head stride 0: every head reads the same row (from L1)."""
    ca, cb = _load_pairs(cos_ptr, cbase, hh, hmask, stride_ch, stride_cw, NH, R2, HALF_PAD,
                         INTERLEAVED, TABLE_HALF, WORDS, ROW)
    sa, sb = _load_pairs(sin_ptr, sbase, hh, hmask, stride_sh, stride_sw, NH, R2, HALF_PAD,
                         INTERLEAVED, TABLE_HALF, WORDS, ROW)
    return ca, cb, sa, sb


@jit
def _alpha(a_ptr, alpha_val, NORM: tl.constexpr, ALPHA_PTR: tl.constexpr):
    """DyT's alpha (NORM 3) from its tensor or its Python float; 0 for the other norms."""
    alpha = 0.0
    if NORM == 3:
        if ALPHA_PTR:
            alpha = tl.load(a_ptr).to(tl.float32)
        else:
            alpha = alpha_val
    return alpha


@jit
def _norm_affine(x, w, b, mean, rstd, alpha,
                 NORM: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                 ROUND_PRE_W: tl.constexpr, ACT: tl.constexpr):
    """Normalise one tile; ``w`` / ``b`` are weight and bias tiles of the same layout."""
    if NORM == 1:
        y = x * rstd
    elif NORM == 2:
        y = (x - mean) * rstd
    elif NORM == 3:
        if ROUND_PRE_W:  # SAME's DynamicTanh in 16 bits rounds alpha * x before the tanh too
            y = _tanh(_rnd(alpha * x, ACT))
        else:
            y = _tanh(alpha * x)
    else:
        y = x
    if ROUND_PRE_W:  # the module's own rounding: from here on in the (half) weight dtype
        y = _rnd(y, ACT)
    if HAS_W:
        y = y * w
        if ROUND_PRE_W and HAS_B:
            y = _rnd(y, ACT)
    if HAS_B:
        y = y + b
    return y


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
def _quant_values(y, inv, QUANT: tl.constexpr):
    """``y * inv`` (``inv`` from :func:`_quant_scale`) rounded to the 8-bit format, as an
    int32 that ``_quant_ptr``'s pointer stores: int8 half to even (the value), fp8 e4m3 to
    nearest even (its bit pattern). One multiply a value: an IEEE division a value tripled
    the sm_90 instructions of Wan's flat-row build (3,536 against the 16-bit build's 1,192).

    int8: adding 1.5 * 2^23 rounds half to even and leaves the integer in the low mantissa
    bits (exact for |t| < 2^22), so one add, an integer subtract and no conversion (F2I runs
    at a quarter of the FP32 rate). No clamp: ``|y| <= amax`` and ``inv <= 127 / amax`` up to
    two roundings, so ``|y * inv| < 127.5``. Rounding in arithmetic rather than by a
    conversion also keeps the bits independent of how one is lowered (Triton's interpreter
    rounds fp32 -> float8e4nv by the first cut-off bit alone) and of whether the GPU converts
    to float8 at all (sm_89+)."""
    t = y * inv
    if QUANT == 1:
        return (t + 12582912.0).to(tl.int32, bitcast=True) - 0x4B400000
    else:
        return _e4m3_code(_e4m3_rn(t)).to(tl.int32, bitcast=True)


@jit
def _quant_scale(amax, QUANT: tl.constexpr):
    """(scale, inv) of a head whose values reach ``amax``: scale = amax / M, inv = M / amax
    (M = 127 for int8, 448 for fp8; IEEE divisions, one a head; inv capped at the largest
    fp32, which only an amax below 4e-37 reaches); both 1 where amax is 0 (the flat-row
    kernel's store shares it)."""
    if QUANT == 1:
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
    the sums (sm_90, the flat-row kernel at Wan 14B: 8 pairs a thread instead of the 16-bit
    build's 4; the per-token kernel in fp32), and the 8-bit values would quantize another
    rounding of the statistics than the 16-bit call's output (tests/test_qk_quantize.py
    compares the sm_90 builds' layouts)."""
    if ROWS:
        return tl.max_contiguous(off.to(tl.int64), [1, VEC])
    else:
        return tl.max_contiguous(off.to(tl.int64), VEC)


@jit
def _quant_ptr(o_ptr, QUANT: tl.constexpr):
    """Where ``_quant_values`` are stored: the int8 output, or the float8 output's bytes."""
    if QUANT == 2:
        return o_ptr.to(tl.pointer_type(tl.uint8))
    else:
        return o_ptr


@jit
def _quantize_store(o_ptr, obase, hh, hmask, stride_oh, stride_od, sc_ptr, scbase, stride_sch,
                    oa, ob, yp, ma, mp, R2: tl.constexpr, P: tl.constexpr, NH: tl.constexpr,
                    HALF_PAD: tl.constexpr, PASS_PAD: tl.constexpr,
                    INTERLEAVED: tl.constexpr, ACT: tl.constexpr, QUANT: tl.constexpr):
    """Quantize each head of a piece to 8 bits with one fp32 scale a head (QUANT 1: int8,
    2: fp8 e4m3): the values are the ones the 16-bit path stores (rounded to ``ACT``), the
    amax spans the head's rotary pairs and pass-through channels (docs/qk_norm_rope.md,
    "8-bit output")."""
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
    tl.store(sc_ptr + scbase + hh.to(tl.int64) * stride_sch, scale, mask=hmask)
    qo_ptr = _quant_ptr(o_ptr, QUANT)
    # vectorised no wider than the 16-bit stores (128 bits of ACT a thread): _same_order
    VEC: tl.constexpr = 128 // ACT.primitive_bitwidth
    _store_pairs(qo_ptr, obase, hh, hmask, stride_oh, stride_od,
                 _quant_values(oa, inv, QUANT), _quant_values(ob, inv, QUANT),
                 NH, R2, HALF_PAD, INTERLEAVED, False, VEC)
    if P > 0:
        jp = tl.arange(0, PASS_PAD)[None, :]
        tl.store(qo_ptr + obase + _same_order(hh * stride_oh + (2 * R2 + jp) * stride_od, VEC,
                                              True),
                 _cast_out(_quant_values(yp, inv, QUANT), qo_ptr.dtype.element_ty), mask=mp)


@jit
def _finish_piece(o_ptr, obase, hh, hmask, stride_oh, stride_od, h_start,
                  xa, xb, xp, mp, mean, rstd, alpha, w_ptr, b_ptr,
                  cos_ptr, sin_ptr, cbase, sbase, t_ch, stride_cw, t_sh, stride_sw,
                  TABLE_HALF: tl.constexpr,
                  D: tl.constexpr, R2: tl.constexpr, P: tl.constexpr,
                  HALF_PAD: tl.constexpr, PASS_PAD: tl.constexpr,
                  NH: tl.constexpr, NORM: tl.constexpr, SPAN_ALL: tl.constexpr,
                  HAS_W: tl.constexpr, HAS_B: tl.constexpr, ROUND_PRE_W: tl.constexpr,
                  ROUND_NORM: tl.constexpr, ROPE: tl.constexpr, INTERLEAVED: tl.constexpr,
                  ACT: tl.constexpr, sc_ptr, scbase, stride_sch, QUANT: tl.constexpr,
                  X_WORDS: tl.constexpr = False,
                  W_WORDS: tl.constexpr = False, T_WORDS: tl.constexpr = False,
                  W_ROW: tl.constexpr = False, T_ROW: tl.constexpr = False):
    # weight/bias: per head (same D channels for every head: head stride 0, L1 hits) or
    # across heads (channel h * D + d)
    if SPAN_ALL:
        w_sh = D
    else:
        w_sh = 0
    wa = 1.0
    wb = 1.0
    ba = 0.0
    bb = 0.0
    if HAS_W:
        wa, wb = _load_pairs(w_ptr, h_start * w_sh, hh, hmask, w_sh, 1, NH, R2, HALF_PAD,
                             INTERLEAVED, False, W_WORDS, W_ROW)
    if HAS_B:
        ba, bb = _load_pairs(b_ptr, h_start * w_sh, hh, hmask, w_sh, 1, NH, R2, HALF_PAD,
                             INTERLEAVED, False, W_WORDS, W_ROW)
    ya = _norm_affine(xa, wa, ba, mean, rstd, alpha, NORM, HAS_W, HAS_B, ROUND_PRE_W, ACT)
    yb = _norm_affine(xb, wb, bb, mean, rstd, alpha, NORM, HAS_W, HAS_B, ROUND_PRE_W, ACT)
    if ROUND_NORM:  # where diffusers' eager code rounds: between the norm and the rotation
        ya = _rnd(ya, ACT)
        yb = _rnd(yb, ACT)
    if ROPE:
        # the token's table row, loaded here rather than with x: it is live only for the
        # rotation (the second tensor's load hits L1), which keeps the registers of a
        # whole-token program low enough for more programs per SM
        ca, cb, sa, sb = _load_rope_tables(cos_ptr, sin_ptr, cbase + h_start * t_ch,
                                           sbase + h_start * t_sh, hh, hmask, t_ch,
                                           stride_cw, t_sh, stride_sw, NH, R2, HALF_PAD,
                                           INTERLEAVED, TABLE_HALF, T_WORDS, T_ROW)
        oa = ya * ca - yb * sa
        ob = yb * cb + ya * sb
    else:
        oa = ya
        ob = yb
    if QUANT == 0:
        _store_pairs(o_ptr, obase, hh, hmask, stride_oh, stride_od, oa, ob, NH, R2, HALF_PAD,
                     INTERLEAVED, X_WORDS)
    yp = 0.0
    if P > 0:
        jp = tl.arange(0, PASS_PAD)[None, :]
        wp = 1.0
        bp = 0.0
        if HAS_W:
            wp = tl.load(w_ptr + h_start * w_sh + hh * w_sh + 2 * R2 + jp, mask=mp,
                         other=0.0).to(tl.float32)
        if HAS_B:
            bp = tl.load(b_ptr + h_start * w_sh + hh * w_sh + 2 * R2 + jp, mask=mp,
                         other=0.0).to(tl.float32)
        yp = _norm_affine(xp, wp, bp, mean, rstd, alpha, NORM, HAS_W, HAS_B, ROUND_PRE_W, ACT)
        if QUANT == 0:
            tl.store(o_ptr + obase + hh * stride_oh + (2 * R2 + jp) * stride_od,
                     _cast_out(yp, o_ptr.dtype.element_ty), mask=mp)
    if QUANT != 0:
        # the head's scale needs all of its channels: the rotary pairs are stored with the
        # pass-through ones, after the amax (one pass, the head's values in registers)
        ma = hmask & (tl.arange(0, HALF_PAD)[None, :] < R2)
        _quantize_store(o_ptr, obase, hh, hmask, stride_oh, stride_od, sc_ptr, scbase,
                        stride_sch, oa, ob, yp, ma, mp, R2, P, NH, HALF_PAD, PASS_PAD,
                        INTERLEAVED, ACT, QUANT)


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
def _load_pass(ptr, base, hh, hmask, stride_h, stride_d,
               R2: tl.constexpr, P: tl.constexpr, PASS_PAD: tl.constexpr):
    jp = tl.arange(0, PASS_PAD)[None, :]
    mp = hmask & (jp < P)
    xp = tl.load(ptr + base + hh * stride_h + (2 * R2 + jp) * stride_d, mask=mp,
                 other=0.0).to(tl.float32)
    return xp, mp


@jit
def _load_tensor(x_ptr, xbase, stride_xh, stride_xd, h_start, h_end,
                 R2: tl.constexpr, P: tl.constexpr, HALF_PAD: tl.constexpr,
                 PASS_PAD: tl.constexpr, P0: tl.constexpr, P1: tl.constexpr,
                 INTERLEAVED: tl.constexpr, OFF64: tl.constexpr, WORDS: tl.constexpr = False):
    """All of one tensor's channels for the program's heads, as fp32 tiles."""
    xbase = xbase + h_start * stride_xh
    hh0, hm0 = _local_heads(h_start, h_end, 0, P0, OFF64)
    xa0, xb0 = _load_pairs(x_ptr, xbase, hh0, hm0, stride_xh, stride_xd, P0, R2, HALF_PAD,
                           INTERLEAVED, False, WORDS)
    xp0, mp0 = _load_pass(x_ptr, xbase, hh0, hm0, stride_xh, stride_xd, R2, P, PASS_PAD)
    xa1 = 0.0
    xb1 = 0.0
    xp1 = 0.0
    if P1 > 0:
        hh1, hm1 = _local_heads(h_start, h_end, P0, P1, OFF64)
        xa1, xb1 = _load_pairs(x_ptr, xbase, hh1, hm1, stride_xh, stride_xd, P1, R2, HALF_PAD,
                               INTERLEAVED, False, WORDS)
        xp1, mp1 = _load_pass(x_ptr, xbase, hh1, hm1, stride_xh, stride_xd, R2, P, PASS_PAD)
    return xa0, xb0, xp0, xa1, xb1, xp1


@jit
def _norm_stats(xa0, xb0, xp0, xa1, xb1, xp1, ma0, mp0, ma1, mp1, alpha_ptr, alpha_val, eps,
                stats_ptr, tok, n_norm, P1: tl.constexpr, NORM: tl.constexpr,
                SPAN_ALL: tl.constexpr, ALPHA_FROM_PTR: tl.constexpr, STATS: tl.constexpr):
    """fp32 (mean, rstd) of each piece (shared when the norm spans all heads) and the DyT
    alpha: what ``_norm_affine`` needs."""
    mean0 = 0.0
    mean1 = 0.0
    rstd0 = 1.0
    rstd1 = 1.0
    alpha = _alpha(alpha_ptr, alpha_val, NORM, ALPHA_FROM_PTR)
    if NORM == 2:
        s0 = _piece_plain_sums(xa0, xb0, xp0, SPAN_ALL)
        if P1 > 0:
            s1 = _piece_plain_sums(xa1, xb1, xp1, SPAN_ALL)
            if SPAN_ALL:
                s0 = s0 + s1
        mean0 = s0 / n_norm
        if P1 > 0:
            if SPAN_ALL:
                mean1 = mean0
            else:
                mean1 = s1 / n_norm
    if NORM == 1 or NORM == 2:
        q0 = _piece_sums(xa0, xb0, xp0, ma0, mp0, mean0, SPAN_ALL, NORM == 2)
        if P1 > 0:
            q1 = _piece_sums(xa1, xb1, xp1, ma1, mp1, mean1, SPAN_ALL, NORM == 2)
            if SPAN_ALL:
                q0 = q0 + q1
        if STATS == 1:  # head parallel, pass 1: this rank's sum of squares, nothing else
            tl.store(stats_ptr + tok, q0)
        if STATS == 2:  # head parallel, pass 2: the all-reduced sum over every rank's heads
            q0 = tl.load(stats_ptr + tok)
        rstd0 = 1.0 / tl.sqrt(q0 / n_norm + eps)
        if P1 > 0:
            if SPAN_ALL:
                rstd1 = rstd0
            else:
                rstd1 = 1.0 / tl.sqrt(q1 / n_norm + eps)

    return mean0, rstd0, mean1, rstd1, alpha


@jit
def _norm_rope_tensor(xa0, xb0, xp0, xa1, xb1, xp1,
                      o_ptr, w_ptr, b_ptr, alpha_ptr, alpha_val, eps, stats_ptr, tok,
                      obase, stride_oh, stride_od,
                      h_start, h_end, n_norm,
                      cos_ptr, sin_ptr, cbase, sbase, t_ch, stride_cw, t_sh, stride_sw,
                      TABLE_HALF: tl.constexpr,
                      D: tl.constexpr, R2: tl.constexpr, P: tl.constexpr,
                      HALF_PAD: tl.constexpr, PASS_PAD: tl.constexpr,
                      P0: tl.constexpr, P1: tl.constexpr,
                      NORM: tl.constexpr, SPAN_ALL: tl.constexpr, HAS_W: tl.constexpr,
                      HAS_B: tl.constexpr, ALPHA_FROM_PTR: tl.constexpr,
                      ROUND_PRE_W: tl.constexpr, ROUND_NORM: tl.constexpr,
                      ROPE: tl.constexpr, INTERLEAVED: tl.constexpr, ACT: tl.constexpr,
                      STATS: tl.constexpr, OFF64: tl.constexpr,
                      sc_ptr, scbase, stride_sch,  # per-head scales (B, H, S) of QUANT
                      QUANT: tl.constexpr,
                      X_WORDS: tl.constexpr = False,
                      W_WORDS: tl.constexpr = False, T_WORDS: tl.constexpr = False,
                      W_ROW: tl.constexpr = False, T_ROW: tl.constexpr = False):
    """Normalise, rotate and store one tensor's tiles (loaded by ``_load_tensor``)."""
    ia = tl.arange(0, HALF_PAD)[None, :]
    jp = tl.arange(0, PASS_PAD)[None, :]
    obase = obase + h_start * stride_oh
    scbase = scbase + h_start * stride_sch
    hh0, hm0 = _local_heads(h_start, h_end, 0, P0, OFF64)
    ma0 = hm0 & (ia < R2)
    mp0 = hm0 & (jp < P)
    ma1 = ma0
    mp1 = mp0
    if P1 > 0:
        hh1, hm1 = _local_heads(h_start, h_end, P0, P1, OFF64)
        ma1 = hm1 & (ia < R2)
        mp1 = hm1 & (jp < P)

    # --- statistics (fp32) ---------------------------------------------------------
    mean0, rstd0, mean1, rstd1, alpha = _norm_stats(
        xa0, xb0, xp0, xa1, xb1, xp1, ma0, mp0, ma1, mp1, alpha_ptr, alpha_val, eps,
        stats_ptr, tok, n_norm, P1, NORM, SPAN_ALL, ALPHA_FROM_PTR, STATS)

    # --- normalise, rotate, store --------------------------------------------------
    if STATS != 1:
        _finish_piece(o_ptr, obase, hh0, hm0, stride_oh, stride_od, h_start, xa0, xb0, xp0, mp0,
                      mean0, rstd0, alpha, w_ptr, b_ptr, cos_ptr, sin_ptr, cbase, sbase, t_ch,
                      stride_cw, t_sh, stride_sw, TABLE_HALF, D, R2, P, HALF_PAD,
                      PASS_PAD, P0, NORM, SPAN_ALL, HAS_W, HAS_B, ROUND_PRE_W, ROUND_NORM, ROPE,
                      INTERLEAVED, ACT, sc_ptr, scbase, stride_sch, QUANT, X_WORDS, W_WORDS,
                      T_WORDS, W_ROW, T_ROW)
        if P1 > 0:
            _finish_piece(o_ptr, obase, hh1, hm1, stride_oh, stride_od, h_start, xa1, xb1, xp1, mp1,
                          mean1, rstd1, alpha, w_ptr, b_ptr, cos_ptr, sin_ptr, cbase, sbase,
                          t_ch, stride_cw, t_sh, stride_sw, TABLE_HALF, D, R2, P,
                          HALF_PAD, PASS_PAD, P1, NORM, SPAN_ALL, HAS_W, HAS_B, ROUND_PRE_W,
                          ROUND_NORM, ROPE, INTERLEAVED, ACT, sc_ptr, scbase, stride_sch,
                          QUANT, X_WORDS, W_WORDS, T_WORDS, W_ROW, T_ROW)


@jit
def _table_row(pos_ptr, b, s, stride_pb, stride_ps, stride_cb, stride_cs, stride_ch,
               stride_sb, stride_ss, stride_sh, ROPE: tl.constexpr, HAS_POS: tl.constexpr,
               TABLE_PER_HEAD: tl.constexpr):
    """The int64 offsets of token (b, s)'s cos and sin rows (gathered by ``positions`` with
    HAS_POS) and the head strides within them: 0 for a row shared by every head."""
    cbase = 0
    sbase = 0
    if ROPE:
        if HAS_POS:
            row = tl.load(pos_ptr + b * stride_pb + s * stride_ps).to(tl.int64)
        else:
            row = s
        cbase = b * stride_cb + row * stride_cs
        sbase = b * stride_sb + row * stride_ss
    if TABLE_PER_HEAD:
        t_ch = stride_ch
        t_sh = stride_sh
    else:  # one row per token, read by every head of Q and K
        t_ch = 0
        t_sh = 0
    return cbase, sbase, t_ch, t_sh


@jit
def _qk_norm_rope_kernel(
    q_ptr, qo_ptr,            # Q in / out (may be the same memory: in place)
    k_ptr, ko_ptr,            # K in / out (unused when HAS_K is false)
    cos_ptr, sin_ptr,         # rotary tables, any float dtype
    pos_ptr,                  # int positions (B, S) gathering table rows (HAS_POS)
    qw_ptr, qb_ptr, qa_ptr,   # Q norm weight, bias, DyT alpha
    kw_ptr, kb_ptr, ka_ptr,   # K norm weight, bias, DyT alpha
    q_alpha, k_alpha,         # DyT alpha when given as a Python float
    q_eps, k_eps,
    q_n, k_n,                 # channels one norm statistic spans (D or H*D), as float
    q_stats_ptr, k_stats_ptr,  # fp32 (B*S,) each: per-token sums of squares of Q, K (STATS)
    q_scale_ptr, k_scale_ptr,  # fp32 (B, H, S) each: a scale per head and token (QUANT)
    S, H,                     # tokens per batch entry, heads
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_qob, stride_qos, stride_qoh, stride_qod,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_kob, stride_kos, stride_koh, stride_kod,
    stride_cb, stride_cs, stride_ch, stride_cw,
    stride_sb, stride_ss, stride_sh, stride_sw,
    stride_pb, stride_ps,
    stride_scb, stride_sch, stride_scs,  # of both scale tensors
    D: tl.constexpr,          # head_dim
    R2: tl.constexpr,         # rotary_dim // 2 (0 without RoPE)
    P: tl.constexpr,          # pass-through channels: D - rotary_dim
    HALF_PAD: tl.constexpr, PASS_PAD: tl.constexpr,
    HG: tl.constexpr,         # heads per program
    P0: tl.constexpr, P1: tl.constexpr,  # HG as two power-of-two pieces (P1 may be 0)
    Q_NORM: tl.constexpr, Q_SPAN_ALL: tl.constexpr, Q_HAS_W: tl.constexpr,
    Q_HAS_B: tl.constexpr, Q_ALPHA_PTR: tl.constexpr, Q_ROUND_PRE_W: tl.constexpr,
    K_NORM: tl.constexpr, K_SPAN_ALL: tl.constexpr, K_HAS_W: tl.constexpr,
    K_HAS_B: tl.constexpr, K_ALPHA_PTR: tl.constexpr, K_ROUND_PRE_W: tl.constexpr,
    HAS_K: tl.constexpr,
    ROPE: tl.constexpr,        # 0 none, 1 rotary on
    INTERLEAVED: tl.constexpr, # pairs (2i, 2i+1) rather than (i, i + r/2)
    TABLE_HALF: tl.constexpr,  # table width r/2 (unique frequencies) rather than r
    TABLE_PER_HEAD: tl.constexpr,
    HAS_POS: tl.constexpr,
    ROUND_NORM: tl.constexpr,
    STATS: tl.constexpr,       # 0 normal; 1 write the sums of squares only; 2 read them
    OFF64: tl.constexpr,       # offsets within a token need 64 bits (huge head strides)
    X_WORDS: tl.constexpr = False,  # interleaved 16-bit Q / K rows read and written a pair a word
    W_WORDS: tl.constexpr = False,  # (X_WORDS) norm weights / biases read a pair a word
    T_WORDS: tl.constexpr = False,  # (X_WORDS) full-width cos / sin read a pair a word
    Q_W_ROW: tl.constexpr = False,  # Q's weight / bias one row for every head, read once
    K_W_ROW: tl.constexpr = False,
    T_ROW: tl.constexpr = False,    # the table one row for every head, read once
    QUANT: tl.constexpr = 0,        # outputs 0: in the activation dtype; 1: int8, 2: float8
                                    # e4m3, each head of a token with its fp32 scale
):
    tok = tl.program_id(0).to(tl.int64)
    h_start = tl.program_id(1).to(tl.int64) * HG
    h_end = tl.minimum(h_start + HG, H)
    b = tok // S
    s = tok - b * S

    cbase, sbase, t_ch, t_sh = _table_row(pos_ptr, b, s, stride_pb, stride_ps, stride_cb,
                                          stride_cs, stride_ch, stride_sb, stride_ss,
                                          stride_sh, ROPE, HAS_POS, TABLE_PER_HEAD)

    qbase = b * stride_qb + s * stride_qs
    qobase = b * stride_qob + s * stride_qos
    kbase = b * stride_kb + s * stride_ks
    kobase = b * stride_kob + s * stride_kos
    scbase = b * stride_scb + s * stride_scs
    # Issue every load of Q and K before the first store: the compiler may not move a load
    # of K above a store to Q (they could alias), and one memory latency per program is
    # what the kernel can afford.
    q0a, q0b, q0p, q1a, q1b, q1p = _load_tensor(q_ptr, qbase, stride_qh, stride_qd, h_start,
                                                h_end, R2, P, HALF_PAD, PASS_PAD, P0, P1,
                                                INTERLEAVED, OFF64, X_WORDS)
    if HAS_K:
        k0a, k0b, k0p, k1a, k1b, k1p = _load_tensor(k_ptr, kbase, stride_kh, stride_kd,
                                                    h_start, h_end, R2, P, HALF_PAD, PASS_PAD,
                                                    P0, P1, INTERLEAVED, OFF64, X_WORDS)
    _norm_rope_tensor(q0a, q0b, q0p, q1a, q1b, q1p, qo_ptr, qw_ptr, qb_ptr, qa_ptr, q_alpha,
                      q_eps, q_stats_ptr, tok, qobase, stride_qoh, stride_qod, h_start, h_end, q_n,
                      cos_ptr, sin_ptr, cbase, sbase, t_ch, stride_cw, t_sh, stride_sw, TABLE_HALF,
                      D, R2, P, HALF_PAD, PASS_PAD, P0, P1,
                      Q_NORM, Q_SPAN_ALL, Q_HAS_W, Q_HAS_B, Q_ALPHA_PTR, Q_ROUND_PRE_W,
                      ROUND_NORM, ROPE, INTERLEAVED, q_ptr.dtype.element_ty, STATS, OFF64,
                      q_scale_ptr, scbase, stride_sch, QUANT,
                      X_WORDS, W_WORDS, T_WORDS, Q_W_ROW, T_ROW)
    if HAS_K:
        _norm_rope_tensor(k0a, k0b, k0p, k1a, k1b, k1p, ko_ptr, kw_ptr, kb_ptr, ka_ptr,
                          k_alpha, k_eps, k_stats_ptr, tok, kobase, stride_koh, stride_kod, h_start, h_end, k_n,
                          cos_ptr, sin_ptr, cbase, sbase, t_ch, stride_cw, t_sh, stride_sw,
                          TABLE_HALF, D, R2, P, HALF_PAD, PASS_PAD, P0, P1,
                          K_NORM, K_SPAN_ALL, K_HAS_W, K_HAS_B, K_ALPHA_PTR, K_ROUND_PRE_W,
                          ROUND_NORM, ROPE, INTERLEAVED, k_ptr.dtype.element_ty, STATS, OFF64,
                          k_scale_ptr, scbase, stride_sch, QUANT,
                          X_WORDS, W_WORDS, T_WORDS, K_W_ROW, T_ROW)
