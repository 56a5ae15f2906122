"""FP8 linear layers: per-token e4m3 activations x per-output-channel e4m3 weights.

``y = (q_x @ q_w^T) * (s_x[:, None] * s_w[None, :]) + bias`` in the activation's dtype, where
``q_x, s_x = quantize_rows(x)`` (one scale a token, from the token's amax) and ``q_w, s_w =
quantize_weight(w)`` (one scale an output channel, once when a model is patched). The GEMM
is :func:`ditfuse.ops.gemm_fp8.gemm_fp8_rows` (on sm_90 a persistent Triton kernel, elsewhere
cuBLASLt's row-wise scaled FP8 GEMM through ``torch._scaled_mm``; the tensor cores' FP8
accumulator, the scales and the bias in fp32 in the epilogue); the quantization of the
activations is :func:`quantize_rows`, one read of ``x`` and a write of a byte an element.

The quantizer and :class:`Rows8` live in :mod:`ditfuse.ops.quantize_rows` (imported here for
the callers of this module), the GEMM in :mod:`ditfuse.ops.gemm_fp8`; this module holds the
layer: validation, then the quantization (unless the input comes quantized) and the GEMM.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from ditfuse.ops.gemm_fp8 import check_residual, gemm_fp8_rows
from ditfuse.ops.quantize_rows import (  # noqa: F401 -- this module's public names too
    ACT_DTYPES,
    FP8,
    QuantRowsConfig,
    Rows8,
    quantize_rows,
    quantize_weight,
)

#: cuBLASLt's FP8 GEMM wants both GEMM dimensions of the weight in multiples of 16.
DIM_MULTIPLE = 16


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
