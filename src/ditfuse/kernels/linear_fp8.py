"""Triton kernel that quantizes rows to float8 e4m3 with one fp32 scale a row (private; the
launch is in :mod:`ditfuse.ops.linear_fp8`).

Row ``m`` of ``x`` (K elements, any float dtype) becomes ``q = e4m3_rne(x * (448 / amax))`` and
``scale = amax / 448`` with ``amax = max |x[m, :]|`` in fp32 (both divisions correctly
rounded); an all-zero row gets ``scale = 1`` and zeros. A NaN anywhere in a row makes its
scale NaN and its values 0, so the GEMM's output row is NaN where a 16-bit linear's is.
"""
from __future__ import annotations

import triton.language as tl

from ditfuse.kernels.element import _cast_e4m3
from ditfuse.runtime.backend import jit

E4M3_MAX: tl.constexpr = 448.0


@jit
def _quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, M, K, stride_xm, stride_qm,
                          ROWS: tl.constexpr, BLOCK_K: tl.constexpr, CHUNKS: tl.constexpr):
    """q[m, :] and scale[m] for ROWS rows a program. One chunk (BLOCK_K >= K): each row is read
    once and held in registers; CHUNKS of BLOCK_K columns otherwise: a first pass finds the
    amax and a second one (from L2: the rows were just read) writes."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < M
    if CHUNKS == 1:
        cols = tl.arange(0, BLOCK_K)
        ok = row_ok[:, None] & (cols < K)[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=ok, other=0.0)
        x = x.to(tl.float32)
        amax = tl.max(tl.abs(x), axis=1)
        nan = tl.max((x != x).to(tl.int32), axis=1)
    else:
        amax = tl.zeros([ROWS], tl.float32)
        nan = tl.zeros([ROWS], tl.int32)
        for c in range(CHUNKS):
            cols = c * BLOCK_K + tl.arange(0, BLOCK_K)
            ok = row_ok[:, None] & (cols < K)[None, :]
            x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=ok, other=0.0)
            x = x.to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
            nan = tl.maximum(nan, tl.max((x != x).to(tl.int32), axis=1))
    has_nan = nan > 0
    amax = tl.where(has_nan, float("nan"), amax)
    zero = amax == 0.0
    inv = tl.where(zero, 1.0, tl.math.div_rn(tl.full(amax.shape, E4M3_MAX, tl.float32),
                                             tl.where(zero, 1.0, amax)))
    scale = tl.where(zero, 1.0, tl.math.div_rn(amax, tl.full(amax.shape, E4M3_MAX, tl.float32)))
    tl.store(scale_ptr + rows, scale, mask=row_ok)
    if CHUNKS == 1:
        y = tl.clamp(x * inv[:, None], -E4M3_MAX, E4M3_MAX)
        y = tl.where(has_nan[:, None], 0.0, y)
        tl.store(q_ptr + rows[:, None] * stride_qm + cols[None, :],
                 _cast_e4m3(y), mask=ok)
    else:
        for c in range(CHUNKS):
            cols = c * BLOCK_K + tl.arange(0, BLOCK_K)
            ok = row_ok[:, None] & (cols < K)[None, :]
            x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=ok, other=0.0)
            y = tl.clamp(x.to(tl.float32) * inv[:, None], -E4M3_MAX, E4M3_MAX)
            y = tl.where(has_nan[:, None], 0.0, y)
            tl.store(q_ptr + rows[:, None] * stride_qm + cols[None, :],
                     _cast_e4m3(y), mask=ok)
