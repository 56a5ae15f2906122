"""Per-token e4m3 quantization of 16-bit activations (and per-output-channel of a linear's
weight): :func:`quantize_rows`, one Triton pass that reads ``x`` once and writes a byte an
element and a scale a token; :class:`Rows8`, an activation as the kernel before an FP8 linear
hands it over quantized.

Layout: the Triton kernel is :mod:`ditfuse.kernels.linear_fp8`; this module holds the launch
config, validation -> allocation -> launch, the public functions and the ``torch.library`` op
(with its fake) that compiled graphs call. The pure-PyTorch reference is
:func:`ditfuse.reference.quantize_rows_fp8_reference`.

Bytes model of :func:`quantize_rows`: read ``M K`` elements, write ``M K`` bytes and ``4 M``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Tuple

import torch
import triton

from ditfuse.kernels.linear_fp8 import _quantize_rows_kernel
from ditfuse.runtime import backend, fastpath, library

ACT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FP8 = torch.float8_e4m3fn


@dataclass(frozen=True)
class QuantRowsConfig:
    """Launch settings of :func:`quantize_rows`: ``rows`` a program; ``pieces``, up to three
    power-of-two widths (0: absent) that hold a row in registers end to end (``chunks`` 1),
    or with ``chunks`` > 1 loads of ``pieces[0]`` columns a row; ``num_warps``."""

    rows: int
    pieces: Tuple[int, int, int]
    chunks: int
    num_warps: int

    #: the narrowest piece (columns): 8 warps of 32 threads load 8 bf16 a thread from 2048
    #: columns, so a narrower piece repeats threads' work; 512 bounds the rounding of a wide
    #: row while keeping that repeat small
    UNIT = 512

    @staticmethod
    def for_width(K: int, gelu: bool = False) -> "QuantRowsConfig":
        """A row up to 16,384 wide is held in registers (one read); rows are added until a
        program holds about 8,192 elements, 8 warps (32 or more elements a thread: 16-byte
        loads of bf16). With ``gelu`` (the pass is bound by its arithmetic, not its bytes) a
        row wider than half its power of two is split into pieces: the largest power of two
        in it, the largest in the rest, and the rest rounded up (13,824 = 8,192 + 4,096 +
        2,048), so the masked columns the GELU still computes are under a quarter of the last
        piece. Without it the pass runs at the copy rate and one power-of-two tile is faster
        (docs/design/linear_fp8.md, "The GELU pass")."""
        width = triton.next_power_of_2(max(K, 1))
        if width > 16384:
            return QuantRowsConfig(
                rows=1, pieces=(8192, 0, 0), chunks=triton.cdiv(K, 8192), num_warps=8
            )
        rows = max(1, min(16, 8192 // width))
        num_warps = 8 if rows * width >= 4096 else 4
        if not gelu or K <= QuantRowsConfig.UNIT:
            return QuantRowsConfig(rows=rows, pieces=(width, 0, 0), chunks=1, num_warps=num_warps)
        n = triton.cdiv(K, QuantRowsConfig.UNIT) * QuantRowsConfig.UNIT
        w0 = 1 << (n.bit_length() - 1)
        rest = n - w0
        w1 = 1 << (rest.bit_length() - 1) if rest else 0
        w2 = triton.next_power_of_2(rest - w1) if rest > w1 else 0
        return QuantRowsConfig(rows=rows, pieces=(w0, w1, w2), chunks=1, num_warps=num_warps)


def _rows_view(x: torch.Tensor, name: str) -> torch.Tensor:
    """``x`` as (M, K) with unit column stride and one row stride, without a copy."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in ACT_DTYPES:
        raise TypeError(f"{name} must be float16, bfloat16 or float32, got {x.dtype}")
    if x.dim() < 1:
        raise ValueError(f"{name} must have at least one dimension (..., K), got a scalar")
    K = x.shape[-1]
    if K == 0:
        raise ValueError(f"{name} must have K = x.shape[-1] > 0, got shape {tuple(x.shape)}")
    if x.stride(-1) != 1 and K > 1:
        raise ValueError(
            f"{name} must have unit stride in its last dimension, got strides {tuple(x.stride())}"
        )
    try:
        return x.view(-1, K)
    except RuntimeError:
        raise ValueError(
            f"{name}'s leading dimensions must flatten to one row stride (a view), "
            f"got shape {tuple(x.shape)}, strides {tuple(x.stride())}"
        ) from None


class Rows8(NamedTuple):
    """A 16-bit activation as an FP8 linear takes it, quantized a token at a time by the kernel
    that produced it (``adaln_modulate(..., quantize="fp8")``): ``q`` e4m3 in the activation's
    shape (..., K), contiguous; ``scale`` fp32 (...), one a token; ``dtype`` the activation's
    (the linear's output dtype). The pair is what :func:`quantize_rows` makes of the 16-bit
    activation, bitwise."""

    q: torch.Tensor
    scale: torch.Tensor
    dtype: torch.dtype


_CACHE = fastpath.Cache()


#: activations :func:`quantize_rows` can apply first (``activation=``): kernel's GELU switch
ACTIVATIONS = {None: False, "gelu_tanh": True}


def _check_activation(activation) -> bool:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be None or 'gelu_tanh', got {activation!r}")
    return ACTIVATIONS[activation]


def _quantize(x2: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, gelu: bool) -> None:
    M, K = x2.shape
    if M == 0:
        return
    cfg = QuantRowsConfig.for_width(K, gelu)
    fastpath.launch(
        _quantize_rows_kernel,
        (triton.cdiv(M, cfg.rows),),
        (x2, q, scale, M, K, x2.stride(0), q.stride(0)),
        dict(
            ROWS=cfg.rows,
            PIECES=cfg.pieces,
            CHUNKS=cfg.chunks,
            GELU=gelu,
            num_warps=cfg.num_warps,
        ),
    )


def _run(x: torch.Tensor, activation: Optional[str] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    gelu = _check_activation(activation)
    x2 = _rows_view(x, "x")
    M, K = x2.shape
    q = torch.empty((M, K), dtype=FP8, device=x.device)
    scale = torch.empty((M,), dtype=torch.float32, device=x.device)
    if not backend.kernel_device_ok(x):
        from ditfuse.reference import quantize_rows_fp8_reference

        rq, rs = quantize_rows_fp8_reference(x2, activation)
        q.copy_(rq)
        scale.copy_(rs)
        return q, scale
    key = None
    if fastpath.usable(x):
        key = ("quantize_rows", gelu, fastpath.sig(x2))
        replay = _CACHE.get(key)
        if replay is not None and replay((x2, q, scale)):
            return q, scale
    with fastpath.Recorder() as rec:
        _quantize(x2, q, scale, gelu)
    if key is not None:
        _CACHE.put(key, rec.replay((x2, q, scale)))
    return q, scale


def quantize_rows(
    x: torch.Tensor, *, activation: Optional[str] = None
) -> Tuple[torch.Tensor, torch.Tensor]:
    r"""Quantize each row (token) of ``x`` -- or of ``gelu(x)`` -- to float8 e4m3 with one fp32
    scale.

    ``amax = max |x[m, :]|`` (fp32); ``q[m, :] = e4m3_rne(x[m, :] * (448 / amax))``,
    ``scale[m] = amax / 448`` (both divisions correctly rounded), so ``q * scale`` is ``x``
    within e4m3's rounding (relative 2^-4). An all-zero row: zeros and scale 1. A row with
    a NaN or an infinity: zeros and scale NaN (the GEMM's row is NaN, where a 16-bit
    linear's is not finite).

    Parameters
    ----------
    x : torch.Tensor, shape (..., K)
        float16 / bfloat16 / float32, unit stride in K, leading dimensions one row stride.
    activation : None or "gelu_tanh"
        "gelu_tanh": the rows quantized are ``ditfuse.gelu(x, "tanh")`` (fp32, rounded to
        x's dtype as the 16-bit model stores them): an FFN's activation and its output
        projection's quantization in one pass.

    Returns
    -------
    q : torch.Tensor, shape (M, K), float8_e4m3fn, M = x.numel() // K
    scale : torch.Tensor, shape (M,), float32

    Bitwise equal to :func:`ditfuse.reference.quantize_rows_fp8_reference` (with
    "gelu_tanh": to it applied to :func:`ditfuse.gelu`'s output).
    """
    if torch.compiler.is_compiling():
        return torch.ops.ditfuse.quantize_rows_fp8(x, activation)
    return _run(x, activation)


def quantize_weight(w: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """A linear layer's weight (N, K) as e4m3 with one fp32 scale an output channel (row):
    :func:`quantize_rows` of ``w``. Once, when a model is patched."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise ValueError(
            f"w must be a 2-D weight (out_features, in_features), got "
            f"{tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__}"
        )
    return _run(w.detach().contiguous() if not w.is_contiguous() else w.detach())


# ---------------------------------------------------------------------------------------
# torch.library op (used under torch.compile; eager calls launch directly)


@library.op("ditfuse::quantize_rows_fp8", mutates_args=())
def _quantize_rows_op(
    x: torch.Tensor, activation: Optional[str]
) -> Tuple[torch.Tensor, torch.Tensor]:
    return _run(x, activation)


@_quantize_rows_op.register_fake
def _(x, activation):
    _check_activation(activation)
    x2 = _rows_view(x, "x")
    M, K = x2.shape
    return (x.new_empty((M, K), dtype=FP8), x.new_empty((M,), dtype=torch.float32))
