"""SwiGLU and GELU (tanh / erf) over a 2-D row view: one read of x, one write.

Launched by :mod:`ditfuse.ops.activations` (launch table, checks, public functions); design
and measurements: docs/design/activations.md."""

from __future__ import annotations

import triton.language as tl
from triton.language.extra import libdevice

from ditfuse.kernels.element import _cast_out, _ex2, _rcp, _rnd, _tanh
from ditfuse.runtime.backend import INTERPRET, jit

#: what ``_act_kernel`` computes (its ``KIND``; ``ditfuse.ops.activations`` passes the values)
SWIGLU = tl.constexpr(0)
GELU_TANH = tl.constexpr(1)
GELU_ERF = tl.constexpr(2)

# On the GPU, libdevice's exp / tanh / erf are the CUDA math library's expf / tanhf / erff,
# which PyTorch's CUDA kernels call (tl.exp would be ex2.approx). The interpreter has no
# libdevice (extern calls raise there): there exp and tanh are evaluated in fp64 and rounded
# (close to correctly rounded, as CUDA's and torch's CPU functions nearly always are), erf
# is math.erf.
_LIBDEVICE = tl.constexpr(not INTERPRET)


# ---------------------------------------------------------------------------------------
# kernel (private)


@jit
def _exp(x):
    if _LIBDEVICE:
        return libdevice.exp(x)
    else:  # numpy's float32 exp is correctly rounded for ~60% of inputs; via fp64, ~all
        return tl.exp(x.to(tl.float64)).to(tl.float32)


@jit
def _act_tanh(x):
    if _LIBDEVICE:
        return _tanhf(x)
    else:
        return _tanh(x.to(tl.float64)).to(tl.float32)


@jit
def _tanhf(x):
    """CUDA's ``tanhf`` (libdevice ``__nv_tanhf``, what PyTorch's GELU kernel calls) without
    its branch: libdevice picks per element between ``copysign(1 - 2 / (2^(2 log2(e) |x|) + 1),
    x)`` (1 from |x| >= 9.0109) for |x| >= 0.6 and an odd polynomial below, so a warp whose
    lanes straddle 0.6 runs both sides plus the branch's bookkeeping (BSSY / BRA / BSYNC, ~5
    instructions an element: GELU's inner argument straddles it in nearly every warp). Here
    both sides are computed and one selected, with libdevice's instructions and constants
    (its SASS): ``ex2.approx`` and ``rcp.approx`` as one MUFU each (their arguments
    there are >= 1.7 and >= 4.3: no flush can differ), the polynomial in fma."""
    a = tl.abs(x)
    r = _rcp(_ex2(a * 2.8853900432586669922) + 1.0)
    big = tl.where(a >= 9.010913848876953125, 1.0, tl.fma(r, -2.0, 1.0))
    big = (big.to(tl.uint32, bitcast=True) | (x.to(tl.uint32, bitcast=True) & 0x80000000)).to(
        tl.float32, bitcast=True
    )
    x2 = x * x
    p = tl.fma(x2, 0.01573968306183815, -0.052303962409496307373)  # 0x3c80f082
    p = tl.fma(x2, p, 0.1331529766321182251)
    p = tl.fma(x2, p, -0.33332768082618713379)
    small = tl.fma(x, x2 * p, x)
    return tl.where(a >= 0.6, big, small)


@jit
def _erf(x):
    if _LIBDEVICE:
        return libdevice.erf(x)
    else:
        return tl.math.erf(x)


@jit
def _act_kernel(
    x_ptr,  # input rows (R, N); SwiGLU: (R, 2N) = [x1 | x2]
    out_ptr,  # output rows (R, N); unit column stride; x's dtype
    R,
    N,  # rows; output columns
    stride_xr,
    stride_or,  # row strides (elements) of x and out
    KIND: tl.constexpr,  # SWIGLU, GELU_TANH or GELU_ERF
    ROWS: tl.constexpr,  # rows per program
    BLOCK: tl.constexpr,  # columns per program (power of two)
):
    """One [ROWS, BLOCK] tile of y = act(x), in PyTorch's CUDA arithmetic (fp32 opmath):
    SwiGLU ``round(round(x1 / (1 + exp(-x1))) * x2)`` (Flux2SwiGLU's two eager ops), GELU
    ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))`` or
    ``x * 0.5 * (1 + erf(x * sqrt(1/2)))``, rounded once."""
    ACT: tl.constexpr = out_ptr.dtype.element_ty
    # int64 rows: row * stride passes 2^31 with large batches (FLUX.2's 4608 x 55296
    # projection: from batch 9) or long sequences
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)[None, :]
    m = (r < R) & (c < N)
    xo = r * stride_xr + c
    x = tl.load(x_ptr + xo, mask=m, other=0.0).to(tl.float32)
    if KIND == SWIGLU:
        g = tl.load(x_ptr + xo + N, mask=m, other=0.0).to(tl.float32)
        # x / (1 + exp(-x)) divided with IEEE rounding as CUDA's '/' (Triton's '/' is div.full)
        a = _rnd(tl.math.div_rn(x, 1.0 + _exp(-x)), ACT)  # silu's output is stored in x's dtype
        y = a * g
    elif KIND == GELU_TANH:
        inner = 0.7978845608028654 * (x + 0.044715 * (x * x * x))
        y = (0.5 * x) * (1.0 + _act_tanh(inner))
    else:
        y = (x * 0.5) * (1.0 + _erf(x * 0.7071067811865476))
    tl.store(out_ptr + r * stride_or + c, _cast_out(y, ACT), mask=m)
