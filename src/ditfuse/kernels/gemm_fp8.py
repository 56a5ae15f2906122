"""Persistent Triton FP8 GEMM with row-wise scales (private; the launch is in
:mod:`ditfuse.ops.gemm_fp8`).

``c[m, n] = round((sum_k a[m, k] * b[n, k]) * sa[m] * sb[n] + bias[n])``: ``a`` (M, K) and
``b`` (N, K) e4m3, row-major (a linear layer's activation rows and its weight as
``nn.Linear`` stores it); ``sa`` (M,) and ``sb`` (N,) fp32; ``bias`` (N,) in c's dtype; ``c``
(M, N) bf16 / fp16. The products accumulate in wgmma's FP8 accumulator (fewer bits than
fp32, as cuBLASLt's fast-accumulation mode), the scales and the bias apply in fp32 in that
order (each step rounded to fp32: the launch turns fp contraction off), and the result is
rounded once to c's dtype.

With ``RESIDUAL`` the epilogue goes on to a block's gated residual: ``c = x + c * gate``,
``x`` (M, N) in c's dtype and ``gate`` gathered a row's batch entry (``m // S``) or token,
with the arithmetic of the AdaLN kernels' ``_residual`` (fp32, one rounding to c's dtype;
``PER_OP``: the product rounded first, as a half-precision eager chain) -- bitwise the
GEMM's output handed to ``ditfuse.gated_residual``, one write of c instead of a write and
three reads.

One program an SM walks the output tiles in steps of the grid, in groups of ``GROUP_M`` tile
rows so that a group's A rows stay in L2 while its tiles sweep N. A, B and C move through
TMA descriptors (built on the host): the loads' out-of-bounds parts read as zero, the stores'
are dropped, so M, N and K need no masks. C is stored in two halves of the tile's columns:
half the epilogue's shared-memory buffer, which leaves room for a fourth stage of A / B.
"""

from __future__ import annotations

from typing import NamedTuple

import triton.language as tl

from ditfuse.kernels.adaln import _residual
from ditfuse.kernels.element import _cast_out, _rnd
from ditfuse.runtime.backend import INTERPRET, jit

_INTERP_LOOP = tl.constexpr(INTERPRET)


class GemmEpilogue(NamedTuple):
    """What a GEMM's epilogue compiles (its ``EPI``) after the scales."""

    has_bias: bool
    residual: bool  # c = x + c * gate
    has_gate: bool  # a row a batch entry (of S >= BLOCK_M rows)
    per_op: bool  # the product rounded to c's dtype before the add (a half-precision chain)


@jit
def _tile_of(tile, tiles_in_group, tiles_m, GROUP_M: tl.constexpr):
    """(tile row, tile column) of the ``tile``-th tile in grouped order."""
    group = tile // tiles_in_group
    first_m = group * GROUP_M
    rows_in_group = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (tile % tiles_in_group) % rows_in_group
    pid_n = (tile % tiles_in_group) // rows_in_group
    return pid_m, pid_n


@jit
def _tile_product(a_desc, b_desc, off_m, off_n, k_tiles, BLOCK_M, BLOCK_N, BLOCK_K):
    """The fp32 sum over K of one output tile, a (BLOCK_M, BLOCK_K) x (BLOCK_K, BLOCK_N)
    wgmma a K step."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if _INTERP_LOOP:  # range() bounds: as in the kernel's tile loop
        ki = 0
        while ki < k_tiles:
            a = a_desc.load([off_m, ki * BLOCK_K])
            b = b_desc.load([off_n, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
            ki += 1
    else:
        for ki in range(k_tiles):
            a = a_desc.load([off_m, ki * BLOCK_K])
            b = b_desc.load([off_n, ki * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
    return acc


@jit
def _store_tile(
    c_desc, acc, sa_ptr, sb_ptr, bias_ptr, res, off_m, off_n, M, N, EPI, BLOCK_M, BLOCK_N
):
    """``acc * sa * sb (+ bias)`` in fp32, rounded once to c's dtype (with ``EPI.residual``,
    then the gated residual of ``res``), stored in two halves of the tile's columns."""
    rows = off_m + tl.arange(0, BLOCK_M)
    cols = off_n + tl.arange(0, BLOCK_N)
    sa = tl.load(sa_ptr + rows, mask=rows < M, other=0.0)
    sb = tl.load(sb_ptr + cols, mask=cols < N, other=0.0)
    out = acc * sa[:, None] * sb[None, :]
    if EPI.has_bias:
        bias = tl.load(bias_ptr + cols, mask=cols < N, other=0.0)
        out = out + bias.to(tl.float32)[None, :]
    halves = tl.permute(tl.reshape(out, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
    left, right = tl.split(halves)
    if EPI.residual:  # a half at a time: x and the gate of one half live beside the other
        left = _gated_residual(left, res, off_m, off_n, M, N, EPI, BLOCK_M, BLOCK_N // 2)
    c_desc.store([off_m, off_n], _cast_out(left, c_desc.dtype))
    if EPI.residual:
        right = _gated_residual(
            right, res, off_m, off_n + BLOCK_N // 2, M, N, EPI, BLOCK_M, BLOCK_N // 2
        )
    c_desc.store([off_m, off_n + BLOCK_N // 2], _cast_out(right, c_desc.dtype))


@jit
def _gated_residual(out, res, off_m, off_n, M, N, EPI, BLOCK_M, BLOCK_N):
    """``x + round(out) * gate`` of the (BLOCK_M, BLOCK_N) block at (off_m, off_n), rounded to
    x's dtype. ``res``: (x's TMA descriptor, gate, rows a gate entry (S), the gate's (b, d)
    strides). The gate is a row a batch entry with S >= BLOCK_M, so a tile spans at most two
    entries: two column vectors and a select by row (a per-element gather would spill)."""
    x_desc, gate_ptr, S, gate_strides = res
    ACT: tl.constexpr = x_desc.dtype
    x = x_desc.load([off_m, off_n]).to(tl.float32)
    g = 0.0
    if EPI.has_gate:
        rows = off_m + tl.arange(0, BLOCK_M)
        cols = off_n + tl.arange(0, BLOCK_N)
        b_lo = off_m // S
        b_hi = min(off_m + BLOCK_M - 1, M - 1) // S
        go = cols * gate_strides[1]
        g_lo = tl.load(gate_ptr + b_lo * gate_strides[0] + go, mask=cols < N, other=0.0)
        g_hi = tl.load(gate_ptr + b_hi * gate_strides[0] + go, mask=cols < N, other=0.0)
        lo = (rows // S == b_lo)[:, None]
        g = tl.where(lo, g_lo.to(tl.float32)[None, :], g_hi.to(tl.float32)[None, :])
    return _residual(x, _rnd(out, ACT), g, True, EPI.has_gate, EPI.per_op, ACT)


@jit
def _gemm_fp8_rows_kernel(
    a_desc,
    b_desc,
    c_desc,
    sa_ptr,
    sb_ptr,
    bias_ptr,
    x_desc,  # the residual stream (M, N), half-tile boxes: read with EPI.residual alone
    gate_ptr,  # the gate, a row a batch entry of S rows: read with EPI.has_gate alone
    S,
    stride_gate_b,
    stride_gate_n,
    M,
    N,
    K,
    EPI: tl.constexpr,  # GemmEpilogue: bias, residual, gate, per-token gate, per-op rounding
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PROGRAMS: tl.constexpr,
):
    pid = tl.program_id(0)
    res = (x_desc, gate_ptr, S, (stride_gate_b, stride_gate_n))
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    tiles = tiles_m * tiles_n
    in_group = GROUP_M * tiles_n
    if _INTERP_LOOP:
        # the interpreter cannot take a program-dependent bound in range() under numpy >=
        # 2.3 (its scalars are 1-element arrays): the same tiles in the same order
        tile = pid
        while tile < tiles:
            pid_m, pid_n = _tile_of(tile, in_group, tiles_m, GROUP_M)
            acc = _tile_product(
                a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, k_tiles, BLOCK_M, BLOCK_N, BLOCK_K
            )
            _store_tile(
                c_desc,
                acc,
                sa_ptr,
                sb_ptr,
                bias_ptr,
                res,
                pid_m * BLOCK_M,
                pid_n * BLOCK_N,
                M,
                N,
                EPI,
                BLOCK_M,
                BLOCK_N,
            )
            tile += PROGRAMS
    else:
        # the epilogue keeps its own tile counter: with the loop nest flattened, the
        # pipeliner may run a tile's epilogue while the next tile's loads are in flight
        tile_c = pid - PROGRAMS
        for tile in tl.range(pid, tiles, PROGRAMS, flatten=True):
            pid_m, pid_n = _tile_of(tile, in_group, tiles_m, GROUP_M)
            acc = _tile_product(
                a_desc, b_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, k_tiles, BLOCK_M, BLOCK_N, BLOCK_K
            )
            tile_c += PROGRAMS
            pid_m, pid_n = _tile_of(tile_c, in_group, tiles_m, GROUP_M)
            _store_tile(
                c_desc,
                acc,
                sa_ptr,
                sb_ptr,
                bias_ptr,
                res,
                pid_m * BLOCK_M,
                pid_n * BLOCK_N,
                M,
                N,
                EPI,
                BLOCK_M,
                BLOCK_N,
            )
