"""Persistent Triton FP8 GEMM with row-wise scales (private; the launch is in
:mod:`ditfuse.ops.gemm_fp8`).

``c[m, n] = round((sum_k a[m, k] * b[n, k]) * sa[m] * sb[n] + bias[n])``: ``a`` (M, K) and
``b`` (N, K) e4m3, row-major (a linear layer's activation rows and its weight as
``nn.Linear`` stores it); ``sa`` (M,) and ``sb`` (N,) fp32; ``bias`` (N,) in c's dtype; ``c``
(M, N) bf16 / fp16. The products accumulate in wgmma's FP8 accumulator (fewer bits than
fp32, as cuBLASLt's fast-accumulation mode), the scales and the bias apply in fp32 in that
order, and the result is rounded once to c's dtype.

One program an SM walks the output tiles in steps of the grid, in groups of ``GROUP_M`` tile
rows so that a group's A rows stay in L2 while its tiles sweep N. A, B and C move through
TMA descriptors (built on the host): the loads' out-of-bounds parts read as zero, the stores'
are dropped, so M, N and K need no masks. C is stored in two halves of the tile's columns:
half the epilogue's shared-memory buffer, which leaves room for a fourth stage of A / B.
"""

from __future__ import annotations

import triton.language as tl

from ditfuse.runtime.backend import INTERPRET, jit

_INTERP_LOOP = tl.constexpr(INTERPRET)


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
    c_desc, acc, sa_ptr, sb_ptr, bias_ptr, off_m, off_n, M, N, HAS_BIAS, BLOCK_M, BLOCK_N
):
    """``acc * sa * sb (+ bias)`` in fp32, rounded once to c's dtype, stored in two halves."""
    rows = off_m + tl.arange(0, BLOCK_M)
    cols = off_n + tl.arange(0, BLOCK_N)
    sa = tl.load(sa_ptr + rows, mask=rows < M, other=0.0)
    sb = tl.load(sb_ptr + cols, mask=cols < N, other=0.0)
    out = acc * sa[:, None] * sb[None, :]
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols, mask=cols < N, other=0.0)
        out = out + bias.to(tl.float32)[None, :]
    halves = tl.permute(tl.reshape(out, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
    left, right = tl.split(halves)
    c_desc.store([off_m, off_n], left.to(c_desc.dtype))
    c_desc.store([off_m, off_n + BLOCK_N // 2], right.to(c_desc.dtype))


@jit
def _gemm_fp8_rows_kernel(
    a_desc,
    b_desc,
    c_desc,
    sa_ptr,
    sb_ptr,
    bias_ptr,
    M,
    N,
    K,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PROGRAMS: tl.constexpr,
):
    pid = tl.program_id(0)
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
                pid_m * BLOCK_M,
                pid_n * BLOCK_N,
                M,
                N,
                HAS_BIAS,
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
                pid_m * BLOCK_M,
                pid_n * BLOCK_N,
                M,
                N,
                HAS_BIAS,
                BLOCK_M,
                BLOCK_N,
            )
