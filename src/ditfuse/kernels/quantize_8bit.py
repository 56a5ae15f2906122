"""Triton kernels that quantize K for the warp-specialized 8-bit attention, and V's key order
(private; the launch is in :mod:`ditfuse.ops.attention_fp8_ws`).

- K: int8 with one fp32 scale per tile of ``BLOCK_N`` keys of one (batch, head), after the
  (batch, head)'s mean key is subtracted: ``k8 = rne((k - mean) * 127 / amax)``,
  ``scale = amax / 127`` (1 for an all-zero tile). The mean takes the shared channel
  offsets of real DiT keys out of the amax; softmax does not see it (it adds ``q . mean`` to
  every score of a row).
- V: the Triton kernel's quantizer (:mod:`ditfuse.kernels.attention_fp8`, ``A_ORDER``), each
  16 keys stored in the order of the 8-bit wgmma's A-operand registers (:func:`key_position`).

A NaN anywhere in a tile of K makes its scale NaN, so the attention's
output is NaN where SDPA's is (the maxima propagate NaN).
"""

from __future__ import annotations

import triton.language as tl

from ditfuse.runtime.backend import jit


@jit
def key_position(s):
    """Where key ``s`` is stored in V^T: within each 16 keys, key ``8 hi + 2 q + i`` at
    ``4 q + 2 hi + i`` -- the column of P's score accumulator that the wgmma A operand's
    registers hold at that position."""
    return (s & ~15) | (((s >> 1) & 3) << 2) | (((s >> 3) & 1) << 1) | (s & 1)


@jit
def _head_block(H, BLOCK: tl.constexpr, D: tl.constexpr, BH_AXIS: tl.constexpr):
    """A (batch, head) token-block program's place: (bh, block, b, h, its BLOCK tokens, the D
    channels). ``BH_AXIS``: the grid axis of the B * H (batch, head) pairs; the other one
    holds the token blocks."""
    if BH_AXIS == 0:
        bh = tl.program_id(0)
        blk = tl.program_id(1)
    else:
        blk = tl.program_id(0)
        bh = tl.program_id(1)
    b = bh // H
    h = bh - b * H
    rows = blk * BLOCK + tl.arange(0, BLOCK)
    d = tl.arange(0, D)
    return bh, blk, b, h, rows, d


@jit
def kept_tokens(keys, b, rows, S, GATHER: tl.constexpr):
    """Which token each of ``rows`` reads, and which rows hold a key. ``GATHER``: the keys
    ``keys = (kept, count)`` of a key mask, compacted -- row r of entry b is token
    ``kept[b, r]`` ((B, S) int32) and rows from ``count[b]`` ((B,) int32) on hold none
    (softmax does not depend on which keys are left out, nor on their order); else row r is
    token r, rows from S on hold none."""
    if GATHER:
        ok = rows < tl.load(keys[1] + b)
        tok = tl.load(keys[0] + b.to(tl.int64) * S + rows, mask=ok, other=0)
    else:
        ok = rows < S
        tok = rows
    return tok, ok


@jit
def _k_tile(
    k_ptr, keys, S, H, k_strides, D: tl.constexpr, BLOCK: tl.constexpr, GATHER: tl.constexpr
):
    """This program's tile of K (grid: (token blocks, B * H); ``k_strides``: (b, s, h, d);
    ``keys``: :func:`kept_tokens`): its place (:func:`_head_block`), the row mask and the fp32
    [BLOCK, D] tile, zero past the keys."""
    bh, blk, b, h, rows, d = _head_block(H, BLOCK, D, BH_AXIS=1)
    tok, ok = kept_tokens(keys, b, rows, S, GATHER)
    rm = ok[:, None]
    x = tl.load(
        k_ptr
        + b.to(tl.int64) * k_strides[0]
        + h.to(tl.int64) * k_strides[2]
        + tok.to(tl.int64)[:, None] * k_strides[1]
        + d[None, :] * k_strides[3],
        mask=rm,
        other=0.0,
    ).to(tl.float32)
    return bh, blk, b, h, rows, d, rm, x


@jit
def _k_mean_kernel(
    k_ptr,
    keys,
    part_ptr,
    S,
    H,
    n_blocks,
    k_strides,
    D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    GATHER: tl.constexpr,
):
    """part[b * H + h, block, d] = the sum over this program's keys of k[b, s, h, d] / the
    entry's key count (S, or ``count[b]`` under a key mask; ``k_strides``: (b, s, h, d)).
    The blocks' parts are summed by the caller in a fixed order: atomics would make the mean's
    last bits, and through K's rounding the attention's, vary from run to run."""
    bh, pid_s, b, h, rows, d, rm, x = _k_tile(k_ptr, keys, S, H, k_strides, D, BLOCK_S, GATHER)
    if GATHER:
        n = tl.maximum(tl.load(keys[1] + b), 1)
    else:
        n = S
    tl.store(part_ptr + (bh.to(tl.int64) * n_blocks + pid_s) * D + d, tl.sum(x, axis=0) / n)


@jit
def _k_block_quant_kernel(
    k_ptr,
    keys,
    mean_ptr,
    k8_ptr,
    kscale_ptr,
    S,
    H,
    n_tiles,
    k_strides,
    k8_strides,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GATHER: tl.constexpr,
):
    """One tile of BLOCK_N keys of one (batch, head): int8 of ``k - mean`` with the tile's
    scale; rows past the keys are not stored (the attention masks them). ``k_strides``: (b,
    s, h, d); ``k8_strides``: (b, s, h), the channels contiguous; ``keys``:
    :func:`kept_tokens`."""
    bh, pid_t, b, h, rows, d, rm, x = _k_tile(k_ptr, keys, S, H, k_strides, D, BLOCK_N, GATHER)
    x = tl.where(rm, x - tl.load(mean_ptr + bh * D + d)[None, :], 0.0)
    amax = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
    amax = tl.where(tl.sum(tl.sum((x != x).to(tl.int32), axis=1), axis=0) > 0, float("nan"), amax)
    ok = amax > 0.0
    scale = tl.where(ok, tl.div_rn(amax, 127.0), 1.0)
    scale = tl.where(amax != amax, amax, scale)  # NaN stays NaN
    inv = tl.where(ok, tl.div_rn(127.0, amax), 1.0)
    # round half to even through the magic number (|x * inv| <= 127)
    y = ((x * inv + 12582912.0) - 12582912.0).to(tl.int8)
    tl.store(
        k8_ptr
        + b.to(tl.int64) * k8_strides[0]
        + h.to(tl.int64) * k8_strides[2]
        + rows.to(tl.int64)[:, None] * k8_strides[1]
        + d[None, :],
        y,
        mask=rm,
    )
    tl.store(kscale_ptr + bh.to(tl.int64) * n_tiles + pid_t, scale)
