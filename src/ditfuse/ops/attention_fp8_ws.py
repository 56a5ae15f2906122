"""The warp-specialized sm_90 8-bit attention from 16-bit Q / K / V: quantize, then launch
(kernels in :mod:`ditfuse.kernels.attention_fp8_ws` and :mod:`ditfuse.kernels.quantize_8bit`;
the front door and its checks are :func:`ditfuse.ops.attention_api.attention`; design
and measurements: docs/design/attention_fp8.md).

Quantization of one call:

- Q: int8, one scale per (batch, head, token)
  (:func:`ditfuse.ops.attention_fp8.quantize_per_token`, bitwise
  :func:`ditfuse.reference.quantize_per_token`);
- K: the (batch, head)'s mean key subtracted, then int8 with one scale per tile of
  ``BLOCK_N`` keys (:func:`quantize_k_blocks`);
- V: e4m3, one scale per (batch, head, channel), transposed with each 16 keys in the
  wgmma A operand's order (:func:`quantize_v` with ``a_order``; the Triton kernel's V in
  token order: bitwise :func:`ditfuse.reference.quantize_v_e4m3` but for the layout).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

#: keys a tile (the K scales' granularity); queries a program (two warpgroups of 64)
BLOCK_N = 128
BLOCK_M = 128
#: tokens of V quantized a program; V^T is padded to a multiple (16-byte TMA rows)
V_BLOCK = 64
_LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class WsConfig:
    """Launch settings of the warp-specialized kernel (docs/design/attention_fp8.md):
    ``stages`` K / V^T slots in the TMA ring; ``maxnreg``: the kernel's register cap at
    entry (the consumers raise theirs to 240, the producer warp drops to 24)."""

    stages: int
    maxnreg: int = 168

    @staticmethod
    def for_head_dim(D: int) -> "WsConfig":
        # four: the consumers take two key tiles a trip (two slots held), and the producer
        # fills the next two meanwhile (the design note)
        return WsConfig(stages=4)


@dataclass(frozen=True)
class Keys:
    """The keys a call attends: every key (``kept`` None), or a key mask's kept keys compacted
    to the front of each batch entry -- row r of entry b is key ``kept[b, r]`` ((B, S_kv)
    int32) and ``count[b]`` ((B,) int32) rows hold one. Softmax depends neither on the keys
    left out nor on the keys' order, so the kernel walks ``count[b]`` rows as if they were
    the whole sequence."""

    kept: Optional[Tensor] = None
    count: Optional[Tensor] = None

    @staticmethod
    def from_mask(key_mask: Optional[Tensor]) -> "Keys":
        """The compaction of a bool (B, S_kv) key mask on its device, without reading it on
        the host (so also inside a CUDA graph capture): kept key s goes to row
        ``cumsum(mask)[s] - 1``; the rows past ``count`` are never read."""
        if key_mask is None:
            return Keys()
        B, S = key_mask.shape
        dev = key_mask.device
        row = torch.cumsum(key_mask, dim=1, dtype=torch.int32) - 1
        kept = torch.zeros(B, S + 1, dtype=torch.int32, device=dev)
        tok = torch.arange(S, dtype=torch.int32, device=dev).expand(B, S)
        # the keys left out all go to the spare column S
        kept.scatter_(1, torch.where(key_mask, row, S).long(), tok)
        return Keys(kept[:, :S].contiguous(), key_mask.sum(dim=1, dtype=torch.int32))

    @property
    def gather(self) -> bool:
        return self.kept is not None

    def args(self, dummy: Tensor) -> tuple:
        """The kernels' ``keys`` argument (kept, count); ``dummy`` for both without a mask."""
        return (self.kept, self.count) if self.gather else (dummy, dummy)


def quantize_k_blocks(k4: Tensor, keys: Keys = Keys()):
    """K (B, S, H, D) 16-bit -> (k8 int8 (B, S, H, D) contiguous, scales fp32 (B*H, tiles)):
    ``k8 = rne((k - mean) * 127 / amax)`` a tile, mean over the (batch, head)'s keys (the
    same bits every run: no atomics). Under a key mask (``keys``) row r is the entry's kept
    key r and the mean is over its kept keys; rows past them are not written."""
    import triton

    from ditfuse.kernels.quantize_8bit import _k_block_quant_kernel, _k_mean_kernel

    B, S, H, D = k4.shape
    n_blocks = triton.cdiv(S, V_BLOCK)
    part = torch.empty(B * H, n_blocks, D, dtype=torch.float32, device=k4.device)
    ka = keys.args(part)
    _k_mean_kernel[(n_blocks, B * H)](
        k4, ka, part, S, H, n_blocks, k4.stride(), D=D, BLOCK_S=V_BLOCK, GATHER=keys.gather
    )
    # the blocks' parts in one fixed order (no atomics): the same bits every run
    mean = part.sum(1).view(B, H, D)
    tiles = triton.cdiv(S, BLOCK_N)
    k8 = torch.empty(B, S, H, D, dtype=torch.int8, device=k4.device)
    kb = torch.empty(B * H, tiles, dtype=torch.float32, device=k4.device)
    _k_block_quant_kernel[(tiles, B * H)](
        k4,
        ka,
        mean,
        k8,
        kb,
        S,
        H,
        tiles,
        k4.stride(),
        k8.stride()[:3],
        D=D,
        BLOCK_N=BLOCK_N,
        GATHER=keys.gather,
        num_warps=8,
    )
    return k8, kb


def quantize_v(v4: Tensor, a_order: bool = False, keys: Keys = Keys(), batch_amax: bool = False):
    """V (B, S, H, D) 16-bit -> (vt e4m3 (B, H, D, S_pad), scale fp32 (B, H, D)):
    ``vt[b, h, d, s] = e4m3(v[b, s, h, d] / scale[b, h, d])``, ``scale = amax / 448``
    over the tokens (1 for a zero channel, NaN for a channel holding a NaN); tokens past S are
    zeros. ``a_order``: token s at column
    :func:`ditfuse.kernels.quantize_8bit.key_position` (the warp-specialized kernel's V).
    Under a key mask (``keys``) token s is the entry's kept key s, the amax over its kept
    keys, zeros past them. ``batch_amax``: also each batch entry's amax over its heads and
    channels (of the keys quantized) as fp32 bits, int32 (B,) -- a third value returned (one
    small reduction of the channels' amax: a max over the int bits is the max of the values,
    NaN above +inf)."""
    from ditfuse.kernels.attention_fp8 import _v_amax_kernel, _v_quant_kernel

    B, S, H, D = v4.shape
    S_pad = -(-S // V_BLOCK) * V_BLOCK
    amax = torch.zeros(B, H, D, dtype=torch.int32, device=v4.device)  # fp32 bits
    vt = torch.empty(B, H, D, S_pad, dtype=torch.float8_e4m3fn, device=v4.device)
    vscale = torch.empty(B, H, D, dtype=torch.float32, device=v4.device)
    grid = (B * H, S_pad // V_BLOCK)
    st = v4.stride()
    ka, g = keys.args(amax), keys.gather
    _v_amax_kernel[grid](v4, ka, amax, S, H, st, D=D, BLOCK_S=V_BLOCK, GATHER=g, num_warps=4)
    _v_quant_kernel[grid](
        v4,
        ka,
        amax,
        vt,
        vscale,
        S,
        S_pad,
        H,
        st,
        D=D,
        BLOCK_S=V_BLOCK,
        A_ORDER=a_order,
        GATHER=g,
        num_warps=4,
    )
    if batch_amax:
        return vt, vscale, amax.view(B, -1).amax(1)
    return vt, vscale


_ONES: dict = {}


def _ones(device: torch.device) -> Tensor:
    """The kernel's row-sum operand, an e4m3 (8, BLOCK_N) tile of 1.0, kept once a device.
    Made inside a CUDA graph capture, it is the capture's own (its fill is a node of the
    graph, not yet run) and is not kept."""
    t = _ONES.get(device)
    if t is None:
        t = torch.ones(8, BLOCK_N, dtype=torch.float8_e4m3fn, device=device)
        if not (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
            _ONES[device] = t
    return t


def launch(
    q8: Tensor,
    q_scale: Tensor,
    k4: Tensor,
    v4: Tensor,
    out4: Tensor,
    scale: float,
    keys: Keys = Keys(),
    config: WsConfig | None = None,
    out_scale: Optional[Tensor] = None,
) -> Tensor:
    """``out4`` (B, S_q, H, D view, channels contiguous) = 8-bit attention of int8 ``q8``
    (B, S_q, H, D, 16-byte aligned strides) with its per-token scales (B, H, S_q) over the
    16-bit ``k4`` / ``v4`` (B, S_kv, H, D), quantized here; only the keys of ``keys`` (every
    key, or a key mask's kept keys). A batch entry without a key gets zeros.

    With ``out_scale`` (fp32 (B, S_q), contiguous) ``out4`` is e4m3 and holds the 16-bit
    output (v's dtype) quantized with one scale a batch entry, written to ``out_scale`` for
    each of its tokens: the largest |V| the entry attends / 448, which bounds every output
    (the kernel's e4m3 epilogue)."""
    import triton
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from ditfuse.kernels.attention_fp8_ws import _attention_8bit_ws_kernel

    B, S_q, H, D = q8.shape
    S_kv = k4.shape[1]
    cfg = config or WsConfig.for_head_dim(D)
    k8, kb = quantize_k_blocks(k4, keys)
    rows8 = out_scale is not None
    vt, vs, *amax_b = quantize_v(v4, a_order=True, keys=keys, batch_amax=rows8)
    vt = vt.view(-1, vt.shape[-1])  # (B*H*D, S_pad): V^T's TMA rows
    box = gl.NVMMASharedLayout(swizzle_byte_width=min(128, D), element_bitwidth=8, rank=4)
    q_desc = TensorDescriptor(q8, list(q8.shape), list(q8.stride()), [1, 64, 1, D], box)
    k_desc = TensorDescriptor(k8, list(k8.shape), list(k8.stride()), [1, BLOCK_N, 1, D], box)
    vt_desc = TensorDescriptor(
        vt,
        list(vt.shape),
        list(vt.stride()),
        [D, BLOCK_N],
        gl.NVMMASharedLayout.get_default_for([D, BLOCK_N], gl.float8e4nv),
    )
    n_m = triton.cdiv(S_q, BLOCK_M)
    _attention_8bit_ws_kernel[(n_m * B * H,)](
        q_desc,
        k_desc,
        vt_desc,
        q_scale,
        kb,
        vs,
        out4,
        _ones(out4.device),
        keys.count if keys.gather else kb,
        amax_b[0] if rows8 else kb,
        out_scale if rows8 else kb,
        S_q,
        S_kv,
        H,
        n_m,
        scale * _LOG2E,
        *q_scale.stride(),
        out4.stride(0),
        out4.stride(1),
        out4.stride(2),
        D=D,
        BLOCK_N=BLOCK_N,
        STAGES=cfg.stages,
        QK_INT=True,
        ROUND_F16=v4.dtype == torch.float16,
        num_warps=4,
        maxnreg=cfg.maxnreg,
    )
    return out4


def fits(q: Tensor, D: int) -> bool:
    """Whether the kernel takes this call: head_dim 64 / 128 (the one other condition,
    16-byte aligned rows, holds for every tensor the op quantizes)."""
    return D in (64, 128) and q.is_cuda


def scale_or_default(scale, D: int) -> float:
    return 1.0 / math.sqrt(D) if scale is None else float(scale)
