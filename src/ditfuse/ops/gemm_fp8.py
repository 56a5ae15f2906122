"""The FP8 GEMM of :func:`ditfuse.ops.linear_fp8.linear_fp8`: e4m3 rows x e4m3 weight,
row-wise scales.

``gemm_fp8_rows(q, q_scale, w_q, w_scale, bias, out_dtype)`` =
``round((q @ w_q^T) * q_scale[:, None] * w_scale[None, :] + bias)``: the products summed in
the tensor cores' FP8 accumulator (fewer bits than fp32; cuBLASLt's fast-accumulation mode),
the scales and the bias applied in fp32, one rounding to ``out_dtype``.

Route: on sm_90 the persistent Triton kernel of :mod:`ditfuse.kernels.gemm_fp8` (faster than
cuBLASLt's row-wise FP8 GEMM at nine of ten DiT linear shapes on an H100,
docs/design/linear_fp8.md); elsewhere -- sm_89, sm_100, the CPU (tests) --
``torch._scaled_mm`` (cuBLASLt on a GPU). Both accumulate in the tensor cores' FP8
accumulator and apply the scales and the bias in fp32 before the one rounding; their sums
differ in order, so their outputs agree to the accumulator's precision, not bitwise. On a
GPU both operands must start on a 16-byte boundary (TMA's and cuBLASLt's requirement): a
clear error otherwise.

Launch settings: :class:`GemmFp8Config` from :func:`gemm_config` -- one tile shape, the
pipeline's depth by K (a fourth stage of 128-deep A / B tiles where K is short enough for
the loads to run ahead; three at the FFN's K of 13,824, where a fourth measured slower).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import triton

from ditfuse.kernels.gemm_fp8 import GemmEpilogue, _gemm_fp8_rows_kernel
from ditfuse.ops.adaln import gated_residual
from ditfuse.ops.attention import _sm90
from ditfuse.runtime import library

FP8 = torch.float8_e4m3fn
OUT_DTYPES = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class GemmFp8Config:
    """Tile shape and pipeline of the persistent FP8 GEMM (one program an SM)."""

    block_m: int = 128
    block_n: int = 256
    block_k: int = 128
    group_m: int = 8
    num_stages: int = 4
    num_warps: int = 8


#: K up to which the fourth A / B stage pays (H100: K = 5,120 faster, K = 13,824 slower)
FOUR_STAGES_MAX_K = 8192


def gemm_config(M: int, N: int, K: int, residual: bool = False) -> GemmFp8Config:
    """The launch settings for an (M, K) x (K, N) product: 128 x 256 x 128 tiles, 8 warps
    (two consumer warpgroups of 64 rows), 4 stages up to K = 8,192, else 3; N up to 128 gets
    128-wide tiles. With a fused ``residual`` 3 stages: its x half-tile (32 KB) takes the
    fourth stage's shared memory."""
    return GemmFp8Config(
        block_n=256 if N > 128 else 128,
        num_stages=4 if K <= FOUR_STAGES_MAX_K and not residual else 3,
    )


def _sms(device: torch.device) -> int:
    if device.type != "cuda":  # the interpreter: two programs, each walking several tiles
        return 2
    return torch.cuda.get_device_properties(device).multi_processor_count


def triton_route(q: torch.Tensor) -> bool:
    """Whether :func:`gemm_fp8_rows` runs the Triton kernel: on an sm_90 GPU (the capability
    asked once a device, as the attention's route asks it)."""
    return q.is_cuda and _sm90(q.device)


def scaled_mm_rows(q, q_scale, w_q, w_scale, bias, out_dtype: torch.dtype) -> torch.Tensor:
    """The same product through ``torch._scaled_mm`` with row-wise scales (cuBLASLt on a GPU,
    fast accumulation): the route off sm_90, and the peer the benchmark and tests compare."""
    return torch._scaled_mm(
        q,
        w_q.t(),
        scale_a=q_scale[:, None],
        scale_b=w_scale[None, :],
        bias=bias,
        out_dtype=out_dtype,
        use_fast_accum=True,
    )


def launch_gemm_fp8_rows(
    q: torch.Tensor,
    q_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    out: torch.Tensor,
    *,
    residual: Optional[torch.Tensor] = None,
    gate: Optional[torch.Tensor] = None,
    per_op: bool = False,
    config: Optional[GemmFp8Config] = None,
) -> torch.Tensor:
    """The Triton kernel into ``out`` (M, N), operands already checked (:func:`gemm_fp8_rows`):
    ``residual`` (B, S, N) whose rows a TMA descriptor reads as (M, N) (:func:`_tma_rows`),
    ``gate`` a row a batch entry with S >= the tile's rows (:func:`_fusable`). ``config``:
    launch settings other than :func:`gemm_config`'s (tests: small tiles)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    M, K = q.shape
    N = w_q.shape[0]
    cfg = config or gemm_config(M, N, K, residual is not None)
    a = TensorDescriptor.from_tensor(q, [cfg.block_m, cfg.block_k])
    b = TensorDescriptor.from_tensor(w_q, [cfg.block_n, cfg.block_k])
    c = TensorDescriptor.from_tensor(out, [cfg.block_m, cfg.block_n // 2])
    tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    programs = min(_sms(q.device), tiles)
    has_gate = residual is not None and gate is not None
    if has_gate and not (
        (gate.shape[1] == 1 or residual.shape[1] == 1) and residual.shape[1] >= cfg.block_m
    ):
        raise ValueError(
            f"the GEMM's epilogue takes a gate row a batch entry of >= {cfg.block_m} rows, got "
            f"gate {tuple(gate.shape)} for residual {tuple(residual.shape)}"
        )
    # the residual's arguments; without one (or without a gate) placeholders not read
    x, g, S, gstrides = c, w_scale, 1, (0, 0)
    if residual is not None:
        x = TensorDescriptor.from_tensor(residual.view(M, N), [cfg.block_m, cfg.block_n // 2])
        S = residual.shape[1]
    if has_gate:
        g = gate[:, 0]  # (1|B, N)
        gstrides = (g.stride(0) if g.shape[0] > 1 else 0, g.stride(1))
    _gemm_fp8_rows_kernel[(programs,)](
        a,
        b,
        c,
        q_scale,
        w_scale,
        w_scale if bias is None else bias,  # not read without a bias
        x,
        g,
        S,
        *gstrides,
        M,
        N,
        K,
        EPI=GemmEpilogue(
            has_bias=bias is not None,
            residual=residual is not None,
            has_gate=has_gate,
            per_op=residual is not None and per_op,
        ),
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m,
        PROGRAMS=programs,
        num_stages=cfg.num_stages,
        num_warps=cfg.num_warps,
        # the epilogue's steps each rounded to fp32, as the gated-residual kernels and eager
        # PyTorch take them (no fused multiply-add): the fused residual is their bits
        enable_fp_fusion=False,
    )
    return out


def _tma_rows(residual: torch.Tensor) -> bool:
    """Whether ``residual``'s rows view as (M, N) that a TMA descriptor reads: unit stride in
    N, the row stride and the start on 16-byte boundaries."""
    try:
        x2 = residual.view(-1, residual.shape[-1])
    except RuntimeError:
        return False
    return (
        x2.stride(1) == 1
        and (x2.stride(0) * x2.element_size()) % 16 == 0
        and x2.data_ptr() % 16 == 0
    )


def _fusable(residual, gate, K: int, N: int) -> bool:
    """Whether the GEMM's epilogue takes this gated residual: none, or rows a TMA descriptor
    reads and a gate (if any) a row a batch entry of at least a tile's rows (a per-token
    gate, or a gate entry shorter than a tile, would be gathered an element at a time and
    spill: those run ``ditfuse.gated_residual`` after the GEMM)."""
    if residual is None:
        return True
    if not _tma_rows(residual):
        return False
    S = residual.shape[1]
    cfg = gemm_config(residual.numel() // N, N, K, True)
    return gate is None or ((gate.shape[1] == 1 or S == 1) and S >= cfg.block_m)


def _gemm(
    q, q_scale, w_q, w_scale, bias, out_dtype: torch.dtype, residual=None, gate=None, per_op=False
) -> torch.Tensor:
    if q.is_cuda:  # TMA and cuBLASLt both read the operands from 16-byte boundaries
        for name, t in (("q", q), ("w_q", w_q)):
            if t.data_ptr() % 16:
                raise ValueError(
                    f"{name} must start on a 16-byte boundary for the FP8 GEMM (a view at "
                    f"an offset of {t.data_ptr() % 16} bytes); pass a fresh tensor"
                )
    M, N = q.shape[0], w_q.shape[0]
    if M == 0 or not triton_route(q) or not _fusable(residual, gate, q.shape[1], N):
        y = scaled_mm_rows(q, q_scale, w_q, w_scale, bias, out_dtype)
        if residual is None:
            return y
        return gated_residual(
            residual,
            y.view(residual.shape),
            gate,
            rounding="per_op" if per_op else "once",
        ).reshape(M, N)
    out = torch.empty((M, N), device=q.device, dtype=out_dtype)
    # the kernel reads the scales and the bias at unit stride
    bias = None if bias is None else bias.contiguous()
    return launch_gemm_fp8_rows(
        q,
        q_scale.contiguous(),
        w_q,
        w_scale.contiguous(),
        bias,
        out,
        residual=residual,
        gate=gate,
        per_op=per_op,
    )


def check_residual(residual, gate, per_op, M: int, N: int, out_dtype, device) -> None:
    """``residual`` (B, S, N) of ``out_dtype`` with B * S = M, unit stride in N; ``gate``
    (1|B, 1|S, N) floating point (``per_op``: of ``out_dtype``), on ``device``."""
    if not isinstance(residual, torch.Tensor) or residual.dim() != 3:
        raise ValueError(
            f"residual must be a (B, S, N) tensor, got "
            f"{tuple(residual.shape) if isinstance(residual, torch.Tensor) else type(residual)}"
        )
    B, S, Nr = residual.shape
    if B * S != M or Nr != N:
        raise ValueError(
            f"residual has shape {tuple(residual.shape)}; expected (B, S, {N}) with B * S = {M} "
            f"(the GEMM's rows)"
        )
    if residual.dtype != out_dtype or residual.device != device:
        raise ValueError(
            f"residual must be {out_dtype} on {device}, got {residual.dtype} on {residual.device}"
        )
    if residual.stride(-1) != 1 and N > 1:
        raise ValueError(f"residual must have unit stride in N, got {tuple(residual.stride())}")
    if gate is None:
        return
    if (
        not isinstance(gate, torch.Tensor)
        or not gate.is_floating_point()
        or gate.dim() != 3
        or gate.shape[0] not in (1, B)
        or gate.shape[1] not in (1, S)
        or gate.shape[2] != N
        or gate.device != device
    ):
        raise ValueError(
            f"gate must be a floating-point (1|B, 1|S, N) = (1|{B}, 1|{S}, {N}) tensor on "
            f"{device}, got {getattr(gate, 'dtype', type(gate))} "
            f"{tuple(getattr(gate, 'shape', ()))}"
        )
    if per_op and gate.dtype != out_dtype:
        raise ValueError(
            f"per-op rounding emulates a chain computed in {out_dtype}: gate.dtype "
            f"{gate.dtype} must equal it"
        )


def gemm_fp8_rows(
    q: torch.Tensor,
    q_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    out_dtype: torch.dtype,
    residual: Optional[torch.Tensor] = None,
    gate: Optional[torch.Tensor] = None,
    per_op: bool = False,
) -> torch.Tensor:
    """``y = (q @ w_q^T) * q_scale[:, None] * w_scale[None, :] + bias`` rounded to
    ``out_dtype``; with ``residual``, a block's gated residual ``residual + y * gate`` rounded
    to ``out_dtype`` instead (``ditfuse.gated_residual(residual, y, gate)``'s bits; on
    sm_90 in the GEMM's epilogue, elsewhere that kernel after the GEMM).

    Parameters
    ----------
    q : torch.Tensor, shape (M, K), float8_e4m3fn, contiguous
    q_scale : torch.Tensor, shape (M,), float32
    w_q : torch.Tensor, shape (N, K), float8_e4m3fn, contiguous; K and N multiples of 16
    w_scale : torch.Tensor, shape (N,), float32
    bias : torch.Tensor, shape (N,), ``out_dtype``, or None
    out_dtype : torch.float16 or torch.bfloat16
    residual : torch.Tensor, shape (B, S, N), ``out_dtype``, B * S = M, optional
        the residual stream the rows of y (token order) are added to
    gate : torch.Tensor, shape (1|B, 1|S, N), optional
        floating point (fp32 as Wan's modulation, or ``out_dtype``); None: ``residual + y``
    per_op : bool
        ``y * gate`` rounded to ``out_dtype`` before the add (a half-precision eager chain:
        FLUX, HunyuanVideo); else fp32 math and one rounding (Wan)

    Returns
    -------
    torch.Tensor, shape (M, N), ``out_dtype``. The caller
    (:func:`ditfuse.ops.linear_fp8.linear_fp8`) validates the GEMM's operands; this function
    checks the residual's and what the kernel's memory access needs.
    """
    if q.dtype != FP8 or w_q.dtype != FP8 or q.dim() != 2 or w_q.dim() != 2:
        raise TypeError(
            f"q and w_q must be 2-D float8_e4m3fn, got {q.dtype} {tuple(q.shape)} and "
            f"{w_q.dtype} {tuple(w_q.shape)}"
        )
    if q.shape[1] != w_q.shape[1] or not (q.is_contiguous() and w_q.is_contiguous()):
        raise ValueError(
            f"q (M, K) and w_q (N, K) must be contiguous with one K, got {tuple(q.shape)} "
            f"and {tuple(w_q.shape)}"
        )
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be float16 or bfloat16, got {out_dtype}")
    if residual is not None:
        check_residual(residual, gate, per_op, q.shape[0], w_q.shape[0], out_dtype, q.device)
    elif gate is not None:
        raise ValueError("gate is given without a residual")
    if torch.compiler.is_compiling():
        return torch.ops.ditfuse.gemm_fp8_rows(
            q, q_scale, w_q, w_scale, bias, out_dtype, residual, gate, per_op
        )
    return _gemm(q, q_scale, w_q, w_scale, bias, out_dtype, residual, gate, per_op)


# ---------------------------------------------------------------------------------------
# torch.library op (used under torch.compile; eager calls launch directly)


@library.op("ditfuse::gemm_fp8_rows", mutates_args=())
def _gemm_fp8_rows_op(
    q: torch.Tensor,
    q_scale: torch.Tensor,
    w_q: torch.Tensor,
    w_scale: torch.Tensor,
    bias: Optional[torch.Tensor],
    out_dtype: torch.dtype,
    residual: Optional[torch.Tensor] = None,
    gate: Optional[torch.Tensor] = None,
    per_op: bool = False,
) -> torch.Tensor:
    return _gemm(q, q_scale, w_q, w_scale, bias, out_dtype, residual, gate, per_op)


@_gemm_fp8_rows_op.register_fake
def _(q, q_scale, w_q, w_scale, bias, out_dtype, residual=None, gate=None, per_op=False):
    return q.new_empty((q.shape[0], w_q.shape[0]), dtype=out_dtype)
