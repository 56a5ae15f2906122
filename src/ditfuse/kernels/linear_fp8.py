"""Triton kernel that quantizes rows to float8 e4m3 with one fp32 scale a row (private; the
launch is in :mod:`ditfuse.ops.linear_fp8`).

Row ``m`` of ``x`` (K elements, any float dtype) becomes ``q = e4m3_rne(x * (448 / amax))`` and
``scale = amax / 448`` with ``amax = max |x[m, :]|`` in fp32 (both divisions correctly
rounded); an all-zero row gets ``scale = 1`` and zeros. A NaN or an infinity anywhere in a
row makes its scale NaN and its values 0, so the GEMM's output row is NaN where a 16-bit
linear's is not finite.

With ``GELU`` the row is first ``gelu_tanh(x)`` as :func:`ditfuse.gelu` computes it, rounded
to x's dtype: the FFN's activation and the next GEMM's quantization in one pass, bitwise the
two ops one after the other.
"""

from __future__ import annotations

import triton.language as tl

from ditfuse.kernels.activations import _act_tanh
from ditfuse.kernels.element import _PTX, _cast_e4m3, _rnd
from ditfuse.runtime.backend import jit

E4M3_MAX = tl.constexpr(448.0)


@jit
def _load_row(x_ptr, rows, cols, ok, stride_xm, GELU: tl.constexpr):
    """A (ROWS, BLOCK_K) tile of x in fp32 (0 outside ``ok``), through GELU when asked."""
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=ok, other=0.0)
    DT: tl.constexpr = x_ptr.dtype.element_ty
    x = x.to(tl.float32)
    if GELU:
        inner = 0.7978845608028654 * (x + 0.044715 * (x * x * x))
        x = _rnd((0.5 * x) * (1.0 + _act_tanh(inner)), DT)
    return x


@jit
def _max_nan(a, b):
    """max that keeps NaN (one ``FMNMX.NAN``)."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@jit
def _row_amax(x):
    """The rows' max ``|x|`` (fp32 ``x``), NaN where a row holds a NaN. Under the interpreter,
    where a reduction with a combine function runs element by element in Python, one integer
    max of the bits (a NaN's lie above +inf's) gives the same values."""
    if _PTX:
        return tl.reduce(tl.abs(x), 1, _max_nan)
    else:
        top = tl.max(tl.abs(x).to(tl.int32, bitcast=True), 1)
        return tl.where(top > 0x7F800000, float("nan"), top.to(tl.float32, bitcast=True))


@jit
def _row_scale(amax):
    """A row's (has_nan, 448 / amax, amax / 448) from its fp32 ``amax`` (:func:`_row_amax`:
    NaN where the row holds a NaN; any shape): an all-zero row scales by 1, a row holding a
    NaN or an infinity gets scale NaN (and zeros)."""
    has_nan = (amax != amax) | (amax == float("inf"))
    amax = tl.where(has_nan, float("nan"), amax)
    zero = amax == 0.0
    e4m3_max = tl.full(amax.shape, E4M3_MAX, tl.float32)
    inv = tl.where(zero, 1.0, tl.math.div_rn(e4m3_max, tl.where(zero, 1.0, amax)))
    return has_nan, inv, tl.where(zero, 1.0, tl.math.div_rn(amax, e4m3_max))


@jit
def _store_e4m3(ptrs, x, inv, has_nan, ok):
    """``x * inv`` (``inv``, ``has_nan``: broadcast along the rows) rounded to e4m3. No clamp:
    ``|x| <= amax`` puts ``x * inv`` within a rounding of 448, and the conversion saturates
    (``cvt.rn.satfinite``; under the interpreter :func:`_cast_e4m3` clamps)."""
    tl.store(ptrs, _cast_e4m3(tl.where(has_nan, 0.0, x * inv)), mask=ok)


@jit
def _store_q(q_ptr, x, inv, has_nan, rows, cols, ok, stride_qm):
    ptrs = q_ptr + rows[:, None] * stride_qm + cols[None, :]
    _store_e4m3(ptrs, x, inv[:, None], has_nan[:, None], ok)


@jit
def _piece(x_ptr, rows, row_ok, start, K, stride_xm, WIDTH: tl.constexpr, GELU: tl.constexpr):
    """Columns ``start .. start + WIDTH`` of the rows (fp32, 0 past K), their columns and
    mask."""
    cols = start + tl.arange(0, WIDTH)
    ok = row_ok[:, None] & (cols < K)[None, :]
    return _load_row(x_ptr, rows, cols, ok, stride_xm, GELU), cols, ok


@jit
def _quantize_rows_kernel(
    x_ptr,
    q_ptr,
    scale_ptr,
    M,
    K,
    stride_xm,
    stride_qm,
    ROWS: tl.constexpr,
    PIECES: tl.constexpr,
    CHUNKS: tl.constexpr,
    GELU: tl.constexpr,
):
    """q[m, :] and scale[m] for ROWS rows a program. One chunk: each row is read once and held
    in registers as up to three pieces of power-of-two widths ``PIECES`` (0: absent) laid end
    to end, so that a row whose width is not a power of two computes (GELU's arithmetic
    bounds the pass) on a few masked columns rather than up to half its tile. CHUNKS of
    ``PIECES[0]`` columns otherwise: a first pass finds the amax and a second one (from L2:
    the rows were just read) writes."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < M
    W0: tl.constexpr = PIECES[0]
    W1: tl.constexpr = PIECES[1]
    W2: tl.constexpr = PIECES[2]
    if CHUNKS == 1:
        x0, c0, ok0 = _piece(x_ptr, rows, row_ok, 0, K, stride_xm, W0, GELU)
        amax = _row_amax(x0)
        if W1 > 0:
            x1, c1, ok1 = _piece(x_ptr, rows, row_ok, W0, K, stride_xm, W1, GELU)
            amax = _max_nan(amax, _row_amax(x1))
        if W2 > 0:
            x2, c2, ok2 = _piece(x_ptr, rows, row_ok, W0 + W1, K, stride_xm, W2, GELU)
            amax = _max_nan(amax, _row_amax(x2))
    else:
        amax = tl.zeros([ROWS], tl.float32)
        for c in range(CHUNKS):
            x0, c0, ok0 = _piece(x_ptr, rows, row_ok, c * W0, K, stride_xm, W0, GELU)
            amax = _max_nan(amax, _row_amax(x0))
    has_nan, inv, row_scale = _row_scale(amax)
    tl.store(scale_ptr + rows, row_scale, mask=row_ok)
    if CHUNKS == 1:  # the row is still in registers
        _store_q(q_ptr, x0, inv, has_nan, rows, c0, ok0, stride_qm)
        if W1 > 0:
            _store_q(q_ptr, x1, inv, has_nan, rows, c1, ok1, stride_qm)
        if W2 > 0:
            _store_q(q_ptr, x2, inv, has_nan, rows, c2, ok2, stride_qm)
    else:
        for c in range(CHUNKS):
            x0, c0, ok0 = _piece(x_ptr, rows, row_ok, c * W0, K, stride_xm, W0, GELU)
            _store_q(q_ptr, x0, inv, has_nan, rows, c0, ok0, stride_qm)
