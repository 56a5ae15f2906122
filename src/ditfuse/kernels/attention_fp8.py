"""The Triton kernels of 8-bit attention (private; the plan, launch and public function are
in :mod:`ditfuse.ops.attention_fp8`; design and measurements: docs/design/attention_fp8.md).

Operands (quantized by the prologue or by the op itself):

- Q, K: int8 (or e4m3) with one fp32 scale per (batch, head, token): the scores of a key tile
  are ``dot(q, k^T)`` on the tensor cores (int32 accumulation, exact) times the query row's
  scale and the key column's scale.
- V: e4m3 with one fp32 scale per (batch, head, channel) over the whole sequence, stored
  transposed, ``(B, H, D, S_pad)`` with the tokens contiguous: an 8-bit wgmma reads both of its
  operands K-major, and the reduction dimension of ``P @ V`` is the token.
- P: the probabilities times 256 (``exp2`` of the log2-scaled score minus the row max plus 8),
  rounded to e4m3 -- the factor keeps the small probabilities out of e4m3's subnormals and
  cancels against the row sum, which the tensor core sums from the same rounded values (P
  times a column of ones): the output is a convex combination of V's quantized rows, never
  outside their range (summed from the unrounded p, e4m3's rounding of P went uncancelled:
  up to +6 %).

The int32 scores become fp32 without a conversion instruction (I2F runs at a quarter of the
FP32 rate on Hopper): for |s| < 2^22 the bits of ``s + 0x4B400000`` read as fp32 are
``1.5 * 2^23 + s`` exactly (a D <= 128 dot of int8 values is at most 127^2 * 128 < 2^21).
The magic number is subtracted (exact) before the key scale multiplies: ``(1.5 * 2^23 + s) *
k_scale`` would overflow fp32 for a key scale above 2.7e31 (bf16 keys above 3.4e33).

NaN propagates as in softmax attention: a NaN in a token of Q / K makes its per-token scale
NaN (:func:`_qk_quant_kernel`), a NaN in a channel of V that channel's scale
(:func:`_v_amax_kernel`); masked scores are set to -inf with a ``where`` on the final,
scaled score, so that no scale (zero included) meets an infinity in arithmetic.

P @ V accumulates in two levels: each key tile's product in the tensor core's own
accumulator, added to the fp32 running output outside it (``max_num_imprecise_acc`` = the
tile's keys), which is what keeps e4m3 products from drifting over tens of thousands of keys.
"""

from __future__ import annotations

import triton.language as tl

from ditfuse.kernels.element import _cast_e4m3
from ditfuse.kernels.quantize_8bit import _head_block, kept_tokens
from ditfuse.runtime.backend import INTERPRET, jit

_INTERP_LOOP = tl.constexpr(INTERPRET)
_MAGIC_I = tl.constexpr(0x4B400000)  # the int32 bits of 1.5 * 2^23
_MAGIC_F = tl.constexpr(12582912.0)  # 1.5 * 2^23
_LOG2E = tl.constexpr(1.4426950408889634)
_NEG = tl.constexpr(-1.0e30)  # the running max before any key: finite, so that a
#                                       row with no key yet rescales by exp2(0), not NaN


@jit
def _row_amax(x, axis: tl.constexpr):
    """max |x| along ``axis``, NaN where a NaN is among the values (``tl.max`` on the GPU
    skips NaN, as ``fmax`` does)."""
    amax = tl.max(tl.abs(x), axis=axis)
    nan = tl.max((x != x).to(tl.int32), axis=axis) > 0
    return tl.where(nan, float("nan"), amax)


@jit
def _scale_inv(amax, M: tl.constexpr):
    """A quantizer's scale ``amax / M`` and its inverse ``M / amax`` (IEEE divisions; both 1
    where amax is 0, the inverse capped at the largest fp32, NaN kept)."""
    zero = amax == 0.0
    scale = tl.where(zero, 1.0, tl.div_rn(amax, M))
    inv = tl.where(
        zero,
        1.0,
        tl.minimum(tl.div_rn(M, amax), 3.4028234663852886e38, propagate_nan=tl.PropagateNan.ALL),
    )
    return scale, inv


@jit
def _qk_quant_kernel(
    x_ptr, y_ptr, s_ptr, S, H, x_strides, y_strides, D: tl.constexpr, BLOCK_S: tl.constexpr
):
    """Per-token int8 quantization of one head of a block of tokens, as
    :func:`ditfuse.reference.quantize_per_token` (bitwise): x (B, S, H, D) 16-bit, any
    strides -> y int8 (B, S, H, D), scales fp32 (B, H, S) contiguous (``x_strides``,
    ``y_strides``: (b, s, h, d)). scale = amax / 127,
    inv = 127 / amax (IEEE divisions; both 1 where amax is 0, inv capped at the largest
    fp32), ``round_half_even(x * inv)``; a token with a NaN gets a NaN scale (its values 0),
    one with an infinity an infinite scale."""
    bh, pid_s, b, h, rows, d = _head_block(H, BLOCK_S, D, BH_AXIS=0)
    rmask = (rows < S)[:, None]
    r64 = rows.to(tl.int64)[:, None]
    x = tl.load(
        x_ptr
        + b.to(tl.int64) * x_strides[0]
        + h.to(tl.int64) * x_strides[2]
        + r64 * x_strides[1]
        + d[None, :] * x_strides[3],
        mask=rmask,
        other=0.0,
    ).to(tl.float32)
    amax = _row_amax(x, 1)
    scale, inv = _scale_inv(amax, 127.0)
    t = x * inv[:, None]
    # + 1.5 * 2^23 rounds half to even and leaves the integer in the low mantissa bits
    # (|t| < 127.5: no clamp); NaN (a NaN token, or inf * 0) stored as 0
    v = (t + _MAGIC_F).to(tl.int32, bitcast=True) - _MAGIC_I
    v = tl.where(t == t, v, 0)
    tl.store(
        y_ptr
        + b.to(tl.int64) * y_strides[0]
        + h.to(tl.int64) * y_strides[2]
        + r64 * y_strides[1]
        + d[None, :] * y_strides[3],
        v.to(tl.int8),
        mask=rmask,
    )
    tl.store(s_ptr + bh.to(tl.int64) * S + rows, scale, mask=rows < S)


@jit
def _v_block(
    v_ptr, keys, S, H, v_strides, D: tl.constexpr, BLOCK_S: tl.constexpr, GATHER: tl.constexpr
):
    """This program's block of V (``v_strides``: (b, s, h, d); ``keys``:
    :func:`ditfuse.kernels.quantize_8bit.kept_tokens`): (bh, its rows, the channels, the fp32
    [BLOCK_S, D] tile, zero past the keys). Grid: (B * H, token blocks) -- B * H on axis 0,
    which has no 65,535 bound."""
    bh, pid_s, b, h, rows, d = _head_block(H, BLOCK_S, D, BH_AXIS=0)
    tok, ok = kept_tokens(keys, b, rows, S, GATHER)
    base = b.to(tl.int64) * v_strides[0] + h.to(tl.int64) * v_strides[2]
    x = tl.load(
        v_ptr + base + tok.to(tl.int64)[:, None] * v_strides[1] + d[None, :] * v_strides[3],
        mask=ok[:, None],
        other=0.0,
    ).to(tl.float32)
    return bh, rows, d, x


@jit
def _v_amax_kernel(
    v_ptr,
    keys,
    amax_ptr,
    S,
    H,
    v_strides,
    D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    GATHER: tl.constexpr = False,
):
    """amax[b, h, d] = max over the keys of |v[b, s, h, d]|, NaN if one is NaN: an atomic
    max of one token block on the int32 bits of the (non-negative) fp32 amax, which order as
    the values do, with a positive NaN above +inf (Triton's float atomic max drops NaN)."""
    bh, rows, d, x = _v_block(v_ptr, keys, S, H, v_strides, D, BLOCK_S, GATHER)
    tl.atomic_max(amax_ptr + bh * D + d, _row_amax(x, 0).to(tl.int32, bitcast=True))


@jit
def _v_quant_kernel(
    v_ptr,
    keys,
    amax_ptr,
    vt_ptr,
    vscale_ptr,
    S,
    S_pad,
    H,
    v_strides,
    D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    A_ORDER: tl.constexpr = False,
    GATHER: tl.constexpr = False,
):
    """vt[b, h, d, s] = e4m3(v[b, s, h, d] * inv[b, h, d]), inv = 448 / amax, scale = amax /
    448 (both 1 where the channel is zero, NaN where it holds a NaN; one division a channel,
    a multiply a value); rows past the keys up to S_pad are written as zeros. ``amax``:
    the int32 bits of :func:`_v_amax_kernel`. ``A_ORDER``: row s stored at
    :func:`ditfuse.kernels.quantize_8bit.key_position` (the warp-specialized kernel's order);
    ``GATHER``: row s holds a key mask's kept key s (``keys``,
    :func:`ditfuse.kernels.quantize_8bit.kept_tokens`)."""
    bh, rows, d, x = _v_block(v_ptr, keys, S, H, v_strides, D, BLOCK_S, GATHER)
    amax = tl.load(amax_ptr + bh * D + d).to(tl.float32, bitcast=True)
    scale, inv = _scale_inv(amax, 448.0)
    yt = tl.trans(_cast_e4m3(x * inv[None, :]))  # [D, BLOCK_S]
    if A_ORDER:
        # column p holds row perm[p] (key_position(perm[p]) = p), permuted in registers so
        # that the store stays contiguous and vectorized (scattered byte stores made this
        # the slowest of the route's passes: docs/design/attention_fp8.md)
        yt = yt.reshape(D, BLOCK_S // 16, 2, 4, 2).permute(0, 1, 3, 2, 4).reshape(D, BLOCK_S)
    obase = bh.to(tl.int64) * D * S_pad
    tl.store(
        vt_ptr + obase + d[:, None].to(tl.int64) * S_pad + rows[None, :],
        yt,
        mask=(rows < S_pad)[None, :],
    )
    if tl.program_id(1) == 0:
        tl.store(vscale_ptr + bh * D + d, scale)


@jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@jit
def _row_max(x):
    """The row max of the scores, NaN where a score is NaN (``max.NaN``; ``tl.max`` skips
    NaN): the running max, and with it every rescale factor and the row's output, turns NaN
    -- whatever the e4m3 conversion of a NaN P gives (the interpreter's is finite). The
    interpreter runs a combine function in Python: there ``tl.max`` and a NaN test."""
    if _INTERP_LOOP:
        return tl.where(tl.max((x != x).to(tl.int32), axis=1) > 0, float("nan"), tl.max(x, axis=1))
    else:
        return tl.reduce(x, 1, _max_nan)


@jit
def _scores(q, k, ks, QK_INT: tl.constexpr):
    """One key tile's scores before the query row's scale: dot(q, k^T) * k_scale[col]."""
    if QK_INT:
        # the accumulator starts at the magic number (Triton folds the add into the dot's
        # initial value); subtracting it is exact, and the key scale multiplies the integer
        # score itself: no intermediate above |s| * k_scale to overflow
        s = (tl.dot(q, tl.trans(k), out_dtype=tl.int32) + _MAGIC_I).to(tl.float32, bitcast=True)
        return (s - _MAGIC_F) * ks[None, :]
    else:
        return tl.dot(q, tl.trans(k), out_dtype=tl.float32) * ks[None, :]


@jit
def _row_sum_e4m3(p8, BLOCK_N: tl.constexpr):
    """The fp32 row sums of an e4m3 tile ``p8`` (BLOCK_M, BLOCK_N) as one dot with a
    (BLOCK_N, 16) operand whose first column is 1 and the rest 0: the products are exact and
    the tile's sum accumulates as P @ V's does (``max_num_imprecise_acc`` = the tile's keys),
    so the same values make numerator and denominator."""
    first = (tl.arange(0, 16) == 0)[None, :]
    ones = tl.where(first, tl.full((BLOCK_N, 16), 1.0, tl.float32), 0.0).to(tl.float8e4nv)
    return tl.sum(tl.dot(p8, ones, out_dtype=tl.float32, max_num_imprecise_acc=BLOCK_N), axis=1)


@jit
def _key_tile(
    start_n,
    ops,
    state,
    BLOCK_N: tl.constexpr,
    MASK: tl.constexpr,
    BAND: tl.constexpr,
    KMASK: tl.constexpr,
):
    """Scores, online-softmax update and P @ V of one key tile; ``MASK``: check every key.
    ``ops``: (q, the row constants c, the query rows, kv, (S_kv, left, right)) with ``kv``
    K's pointer, base and strides, the key scales' pointer, base and stride, V^T's pointer,
    base and row length; ``state``: (acc, m_i, l_i)."""
    q, c, rows, kv, band = ops
    S_kv, left, right = band
    acc, m_i, l_i = state
    D: tl.constexpr = q.shape[1]
    QK_INT: tl.constexpr = q.dtype == tl.int8
    k_ptr, k_base, stride_ks, stride_kd, ks_ptr, ks_base, stride_kss, vt_ptr, vt_base, S_pad = kv
    cols = start_n + tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    k_ptrs = k_ptr + k_base + cols.to(tl.int64)[:, None] * stride_ks + d[None, :] * stride_kd
    vt_ptrs = vt_ptr + vt_base + d[:, None].to(tl.int64) * S_pad + cols[None, :]
    if MASK:
        kmask = cols < S_kv
        k = tl.load(k_ptrs, mask=kmask[:, None])  # keys past S_kv: scores set to -inf below
        ks = tl.load(ks_ptr + ks_base + cols * stride_kss, mask=kmask, other=0.0)
    else:
        k = tl.load(k_ptrs)
        ks = tl.load(ks_ptr + ks_base + cols * stride_kss)
    if KMASK:
        # a key the mask drops comes with a negative scale (a kept key's is >= 0, or NaN,
        # which stays kept and propagates): the mask costs no load of its own
        kept = ~(ks < 0.0)
        ks = tl.where(kept, ks, 0.0)
    t = _scores(q, k, ks, QK_INT)
    if MASK or KMASK:
        if MASK:
            ok = (cols < S_kv)[None, :]
            if BAND:
                ok = (
                    ok
                    & (cols[None, :] >= rows[:, None] - left)
                    & (cols[None, :] <= rows[:, None] + right)
                )
            if KMASK:
                ok = ok & kept[None, :]
        else:
            ok = kept[None, :]
        # the final score, then -inf where masked: a zero scale never meets -inf (0 * -inf)
        x = tl.where(ok, t * c[:, None], float("-inf"))
        m_new = _max_nan(m_i, _row_max(x))
        p = tl.math.exp2(x - (m_new - 8.0)[:, None])
    else:
        # c >= 0 (a scale is positive), so max(t * c) = c * max(t): one multiply a row;
        # exp2(t * c - m + 8) = 256 * p: P in e4m3 away from the subnormals
        m_new = _max_nan(m_i, _row_max(t) * c)
        p = tl.math.exp2(t * c[:, None] - (m_new - 8.0)[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    p8 = _cast_e4m3(p)
    # the row sum of the rounded P that multiplies V, so that the factor 256 and e4m3's
    # rounding cancel in acc / l; summed by the tensor core (P8 times a column of ones): an
    # e4m3 P read back by CUDA 12.8's ptxas beside the register-operand wgmma gave stale
    # values on sm_90 (docs/design/attention_fp8.md), and the dot is fewer instructions
    l_i = l_i * alpha + _row_sum_e4m3(p8, BLOCK_N)
    if MASK:
        vt = tl.load(vt_ptrs, mask=(cols < S_pad)[None, :], other=0.0)
    else:
        vt = tl.load(vt_ptrs)
    pv = tl.dot(p8, tl.trans(vt), out_dtype=tl.float32, max_num_imprecise_acc=BLOCK_N)
    acc = acc * alpha[:, None] + pv
    return acc, m_new, l_i


@jit
def _key_range(lo, hi, ops, state, BLOCK_N: tl.constexpr, MASK, BAND, KMASK):
    """The key tiles lo, lo + BLOCK_N, ... below hi (:func:`_key_tile`, which takes the
    constexpr flags ``MASK``, ``BAND``, ``KMASK``): ``range`` on the GPU (software-
    pipelined); the interpreter cannot take tensor bounds in range() under numpy >= 2.3,
    so there the same tiles in the same order as a while loop."""
    if _INTERP_LOOP:
        start_n = lo
        while start_n < hi:
            state = _key_tile(start_n, ops, state, BLOCK_N, MASK, BAND, KMASK)
            start_n += BLOCK_N
    else:
        for start_n in range(lo, hi, BLOCK_N):
            state = _key_tile(start_n, ops, state, BLOCK_N, MASK, BAND, KMASK)
    return state


@jit
def _attention_8bit_kernel(
    q_ptr,
    k_ptr,
    vt_ptr,  # q, k 8-bit (B, S, H, D); V^T e4m3 (B, H, D, S_pad)
    qs_ptr,
    ks_ptr,
    vs_ptr,  # q / k scales fp32 (B, H, S); V's (B, H, D)
    o_ptr,  # output (B, S_q, H, D)
    S_q,
    S_kv,
    S_pad,
    H,
    sm_scale,
    left,
    right,
    qs_strides,
    ks_strides,  # (b, h, s) of the scales
    q_strides,
    k_strides,
    o_strides,  # (b, s, h, d)
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    QK_INT: tl.constexpr,
    BAND: tl.constexpr,
    KMASK: tl.constexpr,
):
    """One program: BLOCK_M queries of one (batch, head) against every key of the row's band
    (all keys without ``BAND``) that the key mask keeps (every key without ``KMASK``); a row
    left with no key is written as zeros. One flat grid, query tiles fastest: the programs
    of one (batch, head) run together and share its K / V in L2, and B * H is not bound by
    the 65,535 programs of grid axis 1."""
    pid = tl.program_id(0)
    n_m = tl.cdiv(S_q, BLOCK_M)
    bh = pid // n_m
    pid_m = pid - bh * n_m
    b = bh // H
    h = bh - b * H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < S_q
    d = tl.arange(0, D)
    q_base = b.to(tl.int64) * q_strides[0] + h.to(tl.int64) * q_strides[2]
    k_base = b.to(tl.int64) * k_strides[0] + h.to(tl.int64) * k_strides[2]
    q = tl.load(
        q_ptr + q_base + rows.to(tl.int64)[:, None] * q_strides[1] + d[None, :] * q_strides[3],
        mask=rmask[:, None],
    )  # rows past S_q: never stored
    # the query row's scale times softmax's scale in log2 units: a row constant
    c = tl.load(
        qs_ptr
        + b.to(tl.int64) * qs_strides[0]
        + h.to(tl.int64) * qs_strides[1]
        + rows * qs_strides[2],
        mask=rmask,
        other=1.0,
    ) * (sm_scale * _LOG2E)
    ks_base = b.to(tl.int64) * ks_strides[0] + h.to(tl.int64) * ks_strides[1]
    vt_base = bh.to(tl.int64) * D * S_pad

    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], _NEG, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    if BAND:
        lo = tl.maximum(pid_m * BLOCK_M - left, 0) // BLOCK_N * BLOCK_N
        hi = tl.minimum(pid_m * BLOCK_M + BLOCK_M - 1 + right + 1, S_kv)
        full_hi = lo  # every tile masked: the band cuts through them
    else:
        lo = 0
        hi = S_kv
        full_hi = S_kv // BLOCK_N * BLOCK_N
    kv = (
        k_ptr,
        k_base,
        k_strides[1],
        k_strides[3],
        ks_ptr,
        ks_base,
        ks_strides[2],
        vt_ptr,
        vt_base,
        S_pad,
    )
    ops = (q, c, rows, kv, (S_kv, left, right))
    # the tiles every key of which is in range, without masks; then the masked ones
    state = _key_range(lo, full_hi, ops, (acc, m_i, l_i), BLOCK_N, False, BAND, KMASK)
    acc, m_i, l_i = _key_range(full_hi, hi, ops, state, BLOCK_N, True, BAND, KMASK)
    vs = tl.load(vs_ptr + bh * D + d)
    # l = 0: rows past S_q (never stored), or rows whose every key is masked (zeros). A
    # correctly rounded division (once an output element): equal values of V give exactly
    # their quantized value, not one rounding of a reciprocal off it (fp16 64,000 * (1 +
    # 2^-24) is still 64,000, but 448 * l * (1 / l) need not be 448)
    o = tl.div_rn(acc, tl.where(l_i > 0.0, l_i, 1.0)[:, None]) * vs[None, :]
    o_base = b.to(tl.int64) * o_strides[0] + h.to(tl.int64) * o_strides[2]
    tl.store(
        o_ptr + o_base + rows.to(tl.int64)[:, None] * o_strides[1] + d[None, :] * o_strides[3],
        o.to(o_ptr.dtype.element_ty),
        mask=rmask[:, None],
    )
