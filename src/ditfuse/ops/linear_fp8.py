"""FP8 linear layers: per-token e4m3 activations x per-output-channel e4m3 weights.

``y = (q_x @ q_w^T) * (s_x[:, None] * s_w[None, :]) + bias`` in the activation's dtype, where
``q_x, s_x = quantize_rows(x)`` (one scale a token, from the token's amax) and ``q_w, s_w =
quantize_weight(w)`` (one scale an output channel, once when a model is patched). The GEMM
is :func:`ditfuse.ops.gemm_fp8.gemm_fp8_rows` (on sm_90 a persistent Triton kernel, elsewhere
cuBLASLt's row-wise scaled FP8 GEMM through ``torch._scaled_mm``; the tensor cores' FP8
accumulator, the scales and the bias in fp32 in the epilogue); the quantization of the
activations is :func:`quantize_rows`, one read of ``x`` and a write of a byte an element.

Layout: the Triton kernel is :mod:`ditfuse.kernels.linear_fp8`; this module holds the launch
config, validation -> allocation -> launch, the public functions and the ``torch.library``
op (with its fake) that compiled graphs call. The pure-PyTorch reference is
:func:`ditfuse.reference.quantize_rows_fp8_reference`.

Bytes model of :func:`quantize_rows`: read ``M K`` elements, write ``M K`` bytes and ``4 M``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional, Tuple, Union

import torch
import triton

from ditfuse.kernels.linear_fp8 import _quantize_rows_kernel
from ditfuse.ops.gemm_fp8 import check_residual, gemm_fp8_rows
from ditfuse.runtime import backend, fastpath, library

ACT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FP8 = torch.float8_e4m3fn
#: cuBLASLt's FP8 GEMM wants both GEMM dimensions of the weight in multiples of 16.
DIM_MULTIPLE = 16


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


def fp8_gemm_ok(device: torch.device) -> bool:
    """Whether ``torch._scaled_mm`` runs e4m3 x e4m3 with row-wise scales here: a CUDA GPU of
    compute capability 8.9 or newer, or the CPU (its reference GEMM: tests)."""
    if device.type == "cpu":
        return True
    if device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def linear_fp8(
    x: Union[torch.Tensor, Rows8],
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    *,
    activation: Optional[str] = None,
    residual: Optional[torch.Tensor] = None,
    gate: Optional[torch.Tensor] = None,
    rounding: str = "once",
) -> torch.Tensor:
    r"""``act(x) @ w^T + bias`` on FP8 tensor cores: ``act(x)`` quantized a token at a time
    (:func:`quantize_rows`, which applies ``activation`` in the same pass), the weight given
    quantized (:func:`quantize_weight`). With ``residual``, the block's gated residual after
    it: ``ditfuse.gated_residual(residual, linear, gate, rounding=rounding)``, bit for bit; on
    sm_90 in the GEMM's epilogue where the gate is a row a batch entry (one write of the
    result instead of the linear's write and the residual pass's three tensors).

    Parameters
    ----------
    x : torch.Tensor, shape (..., K), float16 / bfloat16, or :class:`Rows8`
        a :class:`Rows8`: already quantized (by the kernel before), used as it is
    w_q : torch.Tensor, shape (N, K), float8_e4m3fn, row-major
    w_scale : torch.Tensor, shape (N,), float32
    bias : torch.Tensor, shape (N,), optional, x's dtype
    activation : None or "gelu_tanh"
        applied to ``x`` first (``ditfuse.gelu(x, "tanh")``, rounded to x's dtype)
    residual : torch.Tensor, shape (B, S, N) or (B, N), optional
        the residual stream (the output's shape and dtype) the result is added to
    gate : torch.Tensor, optional
        (N,), (1|B, N), (1|B, 1, N) or (1|B, S, N), as ``ditfuse.gated_residual`` takes it;
        None: ``residual + linear``
    rounding : "once" or "per_op"
        as ``ditfuse.gated_residual``'s: fp32 math and one rounding (Wan), or the product
        rounded first (a half-precision chain: FLUX, HunyuanVideo)

    Returns
    -------
    torch.Tensor, shape (..., N), x's dtype. Within the FP8 scheme's error of the 16-bit
    linear (relative L2 ~0.04 on random inputs; the FP8 accumulator of the GEMM); with
    ``residual``, the new residual stream.
    """
    if not isinstance(w_q, torch.Tensor) or w_q.dtype != FP8 or w_q.dim() != 2:
        raise TypeError(
            f"w_q must be a 2-D float8_e4m3fn weight (N, K), got "
            f"{getattr(w_q, 'dtype', type(w_q).__name__)} "
            f"{tuple(getattr(w_q, 'shape', ()))}"
        )
    N, K = w_q.shape
    if not w_q.is_contiguous():
        raise ValueError("w_q must be contiguous (N, K) (row-major)")
    rows8 = x if isinstance(x, Rows8) else None
    if rows8 is not None:
        _check_rows8(rows8, activation)
        x = rows8.q
    elif x.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"x must be float16 or bfloat16 for the FP8 GEMM, got {x.dtype}")
    out_dtype = x.dtype if rows8 is None else rows8.dtype
    if x.shape[-1] != K:
        raise ValueError(f"x's last dimension ({x.shape[-1]}) must equal w_q's in_features ({K})")
    if K % DIM_MULTIPLE or N % DIM_MULTIPLE:
        raise ValueError(
            f"the FP8 GEMM needs in_features and out_features in multiples of "
            f"{DIM_MULTIPLE}, got w_q {tuple(w_q.shape)}"
        )
    if (
        not isinstance(w_scale, torch.Tensor)
        or w_scale.dtype != torch.float32
        or tuple(w_scale.shape) != (N,)
    ):
        raise ValueError(
            f"w_scale must be float32 of shape ({N},), got "
            f"{getattr(w_scale, 'dtype', None)} {tuple(getattr(w_scale, 'shape', ()))}"
        )
    if bias is not None and (bias.dtype != out_dtype or tuple(bias.shape) != (N,)):
        raise ValueError(
            f"bias must be {out_dtype} of shape ({N},), got {bias.dtype} {tuple(bias.shape)}"
        )
    for name, t in (("w_q", w_q), ("w_scale", w_scale), ("bias", bias)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device}, x on {x.device}")
    if not fp8_gemm_ok(x.device):
        what = (
            f"sm_{''.join(map(str, torch.cuda.get_device_capability(x.device)))}"
            if x.device.type == "cuda"
            else f"a {x.device.type} device"
        )
        raise RuntimeError(f"the FP8 GEMM needs an sm_89+ GPU or the CPU; {x.device} is {what}")
    res3 = gate3 = None
    if residual is not None:
        res3, gate3 = _residual_views(residual, gate, rounding, tuple(x.shape[:-1]) + (N,))
        M = res3.shape[0] * res3.shape[1]
        check_residual(res3, gate3, rounding == "per_op", M, N, out_dtype, x.device)
    elif gate is not None:
        raise ValueError("gate is given without a residual")
    if rows8 is None:
        q, s = quantize_rows(x, activation=activation)
    else:
        q, s = rows8.q.view(-1, K), rows8.scale.reshape(-1)
    y = gemm_fp8_rows(q, s, w_q, w_scale, bias, out_dtype, res3, gate3, rounding == "per_op")
    return y.view(*x.shape[:-1], N)


def _residual_views(residual, gate, rounding, shape):
    """(B, S, N) views of ``residual`` (the linear's output ``shape``; (B, N) is (B, 1, N))
    and ``gate`` ((N,), (1|B, N), (1|B, 1, N) or (1|B, S, N)), as the GEMM takes them."""
    if rounding not in ("once", "per_op"):
        raise ValueError(f"rounding must be 'once' or 'per_op', got {rounding!r}")
    if not isinstance(residual, torch.Tensor) or tuple(residual.shape) != shape:
        raise ValueError(
            f"residual must have the output's shape {shape}, got "
            f"{tuple(getattr(residual, 'shape', ())) or type(residual).__name__}"
        )
    if residual.dim() not in (2, 3):
        raise ValueError(f"residual must be (B, S, N) or (B, N), got shape {shape}")
    res3 = residual if residual.dim() == 3 else residual[:, None]
    if gate is None:
        return res3, None
    if not isinstance(gate, torch.Tensor) or gate.dim() not in (1, 2, 3):
        raise ValueError(
            f"gate must be (N,), (1|B, N), (1|B, 1, N) or (1|B, S, N), got "
            f"{tuple(getattr(gate, 'shape', ())) or type(gate).__name__}"
        )
    gate3 = gate[None, None] if gate.dim() == 1 else gate[:, None] if gate.dim() == 2 else gate
    return res3, gate3


def _check_rows8(r: Rows8, activation) -> None:
    if activation is not None:
        raise ValueError("activation applies to a 16-bit x; a Rows8 is already quantized")
    if r.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"x.dtype (a Rows8's) must be float16 or bfloat16, got {r.dtype}")
    if not isinstance(r.q, torch.Tensor) or r.q.dtype != FP8 or not r.q.is_contiguous():
        raise TypeError("x.q (a Rows8's) must be a contiguous float8_e4m3fn tensor")
    if (
        not isinstance(r.scale, torch.Tensor)
        or r.scale.dtype != torch.float32
        or tuple(r.scale.shape) != tuple(r.q.shape[:-1])
        or r.scale.device != r.q.device
    ):
        raise ValueError(
            f"x.scale (a Rows8's) must be float32 of shape {tuple(r.q.shape[:-1])} on "
            f"{r.q.device}, got {getattr(r.scale, 'dtype', None)} "
            f"{tuple(getattr(r.scale, 'shape', ()))}"
        )


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
