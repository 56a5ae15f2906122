"""Triton kernels that quantize K and V for the warp-specialized 8-bit attention (private;
the launch is in :mod:`ditfuse.ops.attention_fp8`, the references in
:mod:`ditfuse.reference`).

- K: int8 with one fp32 scale per tile of ``BLOCK_N`` keys of one (batch, head), after the
  (batch, head)'s mean key is subtracted: ``k8 = rne((k - mean) * 127 / amax)``,
  ``scale = amax / 127`` (1 for an all-zero tile). The mean takes the shared channel
  offsets of real DiT keys out of the amax; softmax does not see it (it adds ``q . mean`` to
  every score of a row).
- V: e4m3 with one scale per (batch, head, channel), transposed to ``(B, H, D, S_pad)`` with
  each 16 keys stored in the order of the 8-bit wgmma's A-operand registers
  (:func:`key_position`), tokens ``S..S_pad`` zero.

A NaN anywhere in a tile of K (a channel of V) makes its scale NaN, so the attention's
output is NaN where SDPA's is (the maxima propagate NaN).
"""
from __future__ import annotations

import triton.language as tl

from ditfuse.kernels.element import _cast_e4m3
from ditfuse.runtime.backend import jit

@jit
def key_position(s):
    """Where key ``s`` is stored in V^T: within each 16 keys, key ``8 hi + 2 q + i`` at
    ``4 q + 2 hi + i`` -- the column of P's score accumulator that the wgmma A operand's
    registers hold at that position."""
    return (s & ~15) | (((s >> 1) & 3) << 2) | (((s >> 3) & 1) << 1) | (s & 1)


@jit
def _tokens(x, src, b, h, rows, D: tl.constexpr, GATHER: tl.constexpr, SCALED: tl.constexpr):
    """Tokens ``rows`` of (b, h) of the 4-D tensor ``x = (pointer, (sb, ss, sh, sd), S)`` as
    an fp32 [rows, D] block (zero past the sequence) and the rows' mask. ``src = (kept,
    count, scales, (qb, qh, qs))``: with ``GATHER`` row r is token ``kept[b, r]`` and rows
    from ``count[b]`` on are past the sequence (the keys a key mask keeps, compacted: softmax
    does not depend on the keys' order); with ``SCALED`` the values are int8 times their
    token's scale."""
    x_ptr, (sb, ss, sh, sd), S = x
    kept_ptr, count_ptr, ks_ptr, (qb, qh, qs) = src
    if GATHER:
        ok = rows < tl.load(count_ptr + b)
        tok = tl.load(kept_ptr + b.to(tl.int64) * S + rows, mask=ok, other=0)
    else:
        ok = rows < S
        tok = rows
    d = tl.arange(0, D)
    v = tl.load(x_ptr + b.to(tl.int64) * sb + h.to(tl.int64) * sh
                + tok.to(tl.int64)[:, None] * ss + d[None, :] * sd,
                mask=ok[:, None], other=0).to(tl.float32)
    if SCALED:
        v = v * tl.load(ks_ptr + b.to(tl.int64) * qb + h.to(tl.int64) * qh + tok * qs,
                        mask=ok, other=0.0)[:, None]
    return v, ok


@jit
def _count(src, b, S, GATHER: tl.constexpr):
    if GATHER:
        return tl.load(src[1] + b)
    return S


@jit
def _k_mean_kernel(k, src, mean_ptr, H, D: tl.constexpr, BLOCK_S: tl.constexpr,
                   GATHER: tl.constexpr, SCALED: tl.constexpr):
    """mean[b, h, d] += the sum over this program's tokens of k[b, s, h, d] / their count
    (fp32 atomics)."""
    bh = tl.program_id(0)
    b = bh // H
    h = bh - b * H
    rows = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    x, ok = _tokens(k, src, b, h, rows, D, GATHER, SCALED)
    n = _count(src, b, k[2], GATHER)
    tl.atomic_add(mean_ptr + bh * D + tl.arange(0, D), tl.sum(x, axis=0) / tl.maximum(n, 1))


@jit
def _k_block_quant_kernel(k, src, mean_ptr, k8_ptr, k8_strides, kscale_ptr, H, n_tiles,
                          D: tl.constexpr, BLOCK_N: tl.constexpr, GATHER: tl.constexpr,
                          SCALED: tl.constexpr):
    """One tile of BLOCK_N keys of one (batch, head): int8 of ``k - mean`` with the tile's
    scale; rows past the sequence are not stored (the attention masks them)."""
    bh = tl.program_id(0)
    pid_t = tl.program_id(1)
    b = bh // H
    h = bh - b * H
    rows = pid_t * BLOCK_N + tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    x, ok = _tokens(k, src, b, h, rows, D, GATHER, SCALED)
    rm = ok[:, None]
    x = tl.where(rm, x - tl.load(mean_ptr + bh * D + d)[None, :], 0.0)
    amax = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
    amax = tl.where(tl.sum(tl.sum((x != x).to(tl.int32), axis=1), axis=0) > 0, float("nan"),
                    amax)
    ok = amax > 0.0
    scale = tl.where(ok, tl.div_rn(amax, 127.0), 1.0)
    scale = tl.where(amax != amax, amax, scale)  # NaN stays NaN
    inv = tl.where(ok, tl.div_rn(127.0, amax), 1.0)
    # round half to even through the magic number (|x * inv| <= 127)
    y = ((x * inv + 12582912.0) - 12582912.0).to(tl.int8)
    ob, os_, oh = k8_strides
    tl.store(k8_ptr + b.to(tl.int64) * ob + h.to(tl.int64) * oh
             + rows.to(tl.int64)[:, None] * os_ + d[None, :], y, mask=rm)
    tl.store(kscale_ptr + bh.to(tl.int64) * n_tiles + pid_t, scale)


@jit
def _v_amax_kernel(v, src, amax_ptr, H, D: tl.constexpr, BLOCK_S: tl.constexpr,
                   GATHER: tl.constexpr):
    """amax[b, h, d] = max over the tokens of |v[b, s, h, d]| (+inf for a channel holding a
    NaN: atomic max ignores NaN; the quantizer reads it back as a NaN scale)."""
    bh = tl.program_id(0)
    b = bh // H
    h = bh - b * H
    rows = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    x, ok = _tokens(v, src, b, h, rows, D, GATHER, False)
    nan = tl.sum((x != x).to(tl.int32), axis=0) > 0
    tl.atomic_max(amax_ptr + bh * D + tl.arange(0, D),
                  tl.where(nan, float("inf"), tl.max(tl.abs(x), axis=0)))


@jit
def _vt_quant_kernel(v, src, amax_ptr, vt_ptr, vscale_ptr, S_pad, H, D: tl.constexpr,
                     BLOCK_S: tl.constexpr, GATHER: tl.constexpr):
    """vt[b, h, d, key_position(s)] = e4m3(v[b, s, h, d] * 448 / amax[b, h, d]), zero past
    the sequence; the scale ``amax / 448`` (1 for a zero channel, NaN for a channel holding
    NaN or inf)."""
    bh = tl.program_id(0)
    pid_s = tl.program_id(1)
    b = bh // H
    h = bh - b * H
    rows = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    d = tl.arange(0, D)
    x, ok = _tokens(v, src, b, h, rows, D, GATHER, False)
    amax = tl.load(amax_ptr + bh * D + d)
    bad = amax == float("inf")
    scale = tl.where(amax > 0.0, tl.div_rn(amax, 448.0), 1.0)
    scale = tl.where(bad, float("nan"), scale)
    inv = tl.where(amax > 0.0, tl.div_rn(448.0, amax), 1.0)
    inv = tl.where(bad, float("nan"), inv)
    y = _cast_e4m3(tl.where(ok[:, None], x * inv[None, :], 0.0))
    tl.store(vt_ptr + bh.to(tl.int64) * D * S_pad + d[:, None].to(tl.int64) * S_pad
             + key_position(rows)[None, :], tl.trans(y), mask=(rows < S_pad)[None, :])
    if pid_s == 0:
        tl.store(vscale_ptr + bh * D + d, scale)
