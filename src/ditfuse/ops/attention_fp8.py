"""Attention, one front door: :func:`attention` -- the exact 16-bit path (PyTorch's SDPA, or
the band kernel of :mod:`ditfuse.ops.attention` for a window) or 8-bit tensor-core attention
on Hopper (``precision="fp8"``): validate -> quantize what is not quantized yet -> launch,
and at the end the ``torch.library`` op with its fake.

The 8-bit scheme (kernels in :mod:`ditfuse.kernels.attention_fp8`; design and measurements:
docs/design/attention_fp8.md): Q and K int8 with one fp32 scale per (batch, head, token) --
what ``qk_norm_rope(..., quantize="int8")`` writes in the pass that norms and rotates them --
V e4m3 with one scale per (batch, head, channel), P e4m3, scores and the softmax in fp32, P V
accumulated in fp32 across key tiles. On devices other than sm_90 (and the CPU without
Triton's interpreter) the same quantization is emulated in PyTorch
(:func:`ditfuse.reference.attention_8bit_core`), never a different formula.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from ditfuse.runtime import backend, library
from ditfuse.ops.attention import _sm90, parse_window, sliding_window_attention
from ditfuse.ops.attention_fp8_ws import quantize_v
from ditfuse.reference import attention_8bit_core

#: values of ``precision``: None the exact 16-bit path, "fp8" 8-bit tensor cores
PRECISIONS = (None, "fp8")
LAYOUTS = ("bshd", "bhsd")
HEAD_DIMS = (64, 128)
ACT_DTYPES = (torch.float16, torch.bfloat16)
QK_8BIT = (torch.int8, torch.float8_e4m3fn)
V_8BIT = torch.float8_e4m3fn
#: tokens of one head of 16-bit q / k quantized a program (the 16-bit route)
QK_BLOCK = 32


@dataclass
class Plan:
    """One checked 8-bit call: every tensor as a (B, S, H, D) view (no copy)."""

    q: Tensor            # int8 / e4m3 (B, S_q, H, D)
    k: Tensor            # int8 / e4m3 (B, S_kv, H, D)
    v: Tensor            # 16-bit (B, S_kv, H, D)
    q_scale: Tensor      # fp32 (B, H, S_q), any strides
    k_scale: Tensor      # fp32 (B, H, S_kv)
    scale: float
    left: int            # -1: unbounded
    right: int
    layout: str
    key_mask: Optional[Tensor] = None  # uint8 view (B, S_kv) of the bool mask: keys kept

    @property
    def band(self) -> bool:
        return self.left >= 0 or self.right >= 0


class Settings(NamedTuple):
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def launch_settings(D: int, qk_dtype: torch.dtype = torch.int8,
                    key_mask: bool = False) -> Settings:
    """Tile and warps of the Triton kernel (docs/design/attention_fp8.md): 128 x 128 tiles on
    two warpgroups, three stages of K / V in flight; two stages for e4m3 q / k and 64-key
    tiles under a key mask, whose key loops (with the rounded P's row sum) spill otherwise
    (sm_90a builds, ``test_sm90_builds``)."""
    if key_mask:
        return Settings(128, 64, 8, 3)
    return Settings(128, 128, 8, 2 if qk_dtype == torch.float8_e4m3fn else 3)


def _heads(x, name: str, layout: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4:
        want = "(B, S, H, D)" if layout == "bshd" else "(B, H, S, D)"
        raise ValueError(f"{name} must be 4-D {want} (layout={layout!r}), got shape "
                         f"{tuple(x.shape)}")
    return x if layout == "bshd" else x.transpose(1, 2)


def _check_scale(s, name: str, of: str, shape: tuple, device) -> Tensor:
    if s is None:
        raise ValueError(f"{name} is required with 8-bit {of} ({of}.dtype is 8-bit): the "
                         f"per-token scales, float32 of shape (B, H, S) = {shape}, as "
                         f"ditfuse.qk_norm_rope(..., quantize=...) returns them")
    if not isinstance(s, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(s).__name__}")
    if s.dtype != torch.float32:
        raise TypeError(f"{name}.dtype must be torch.float32, got {s.dtype}")
    if tuple(s.shape) != shape:
        raise ValueError(f"{name} must have shape (B, H, S) = {shape} (one scale per batch, "
                         f"head and token of {of}), got {tuple(s.shape)}")
    if s.device != device:
        raise ValueError(f"{name} is on {s.device}, {of} on {device}: all on one device")
    return s


def _check_scale_values(s: Tensor, name: str) -> None:
    """Positive and finite scales -- or NaN ones, which a quantizer writes for a token holding
    a NaN (the output is NaN there, as softmax attention's). Checked where it costs no device
    synchronisation: eager, on the CPU; never while tracing (torch.compile, fake tensors,
    meta) or in a CUDA-graph capture, and not for GPU tensors, whose check would wait for
    the stream. The kernel gives NaN-free outputs for a zero scale anyway (masked scores are
    set to -inf after the scales multiply)."""
    if (s.device.type != "cpu" or torch.compiler.is_compiling()
            or isinstance(s, torch._subclasses.FakeTensor) or _capturing()):
        return
    bad = ~((s > 0) & (s < math.inf)) & (s == s)
    if bool(bad.any()):
        v = s[bad][0].item()
        raise ValueError(f"{name} must be positive and finite (or NaN, from a token holding a "
                         f"NaN), got {v} at index {tuple(bad.nonzero()[0].tolist())}")


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _check_precision(precision):
    if not (precision is None or (isinstance(precision, str) and precision in PRECISIONS)):
        raise ValueError(f"precision must be None (the exact 16-bit path) or 'fp8', got "
                         f"{precision!r}")


def _check_key_mask(m, B: int, S_kv: int, device) -> Optional[Tensor]:
    if m is None:
        return None
    if not isinstance(m, Tensor):
        raise TypeError(f"key_mask must be a torch.Tensor, got {type(m).__name__}")
    if m.dtype != torch.bool:
        raise TypeError(f"key_mask.dtype must be torch.bool (True: the key is attended), got "
                        f"{m.dtype}")
    if tuple(m.shape) != (B, S_kv):
        raise ValueError(f"key_mask must have shape (B, S_kv) = {(B, S_kv)}, got "
                         f"{tuple(m.shape)}")
    if m.device != device:
        raise ValueError(f"key_mask is on {m.device}, q on {device}: all on one device")
    return m.view(torch.uint8)


def plan(q, k, v, *, q_scale=None, k_scale=None, window=None, scale=None,
         layout="bshd", key_mask=None, check_scale_values=True) -> Plan:
    """Validate an 8-bit call whose q / k are already 8-bit (see :func:`attention`).
    ``check_scale_values``: the scales' values too (:func:`_check_scale_values`; off for the
    scales :func:`quantize_per_token` wrote, which are NaN / inf for a token holding one)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    q4, k4, v4 = _heads(q, "q", layout), _heads(k, "k", layout), _heads(v, "v", layout)
    for name, t in (("q", q4), ("k", k4)):
        if t.dtype not in QK_8BIT:
            raise TypeError(f"{name}.dtype must be float16 / bfloat16 (quantized here), or "
                            f"int8 / float8_e4m3fn with {name}_scale, one dtype for q and k; "
                            f"got {t.dtype}")
    if q4.dtype != k4.dtype:
        raise TypeError(f"q and k must share one 8-bit dtype, got {q4.dtype} and {k4.dtype}")
    if v4.dtype not in ACT_DTYPES:
        raise TypeError(f"v.dtype must be float16 or bfloat16 (the output's dtype), got "
                        f"{v4.dtype}")
    dev = q4.device
    for name, t in (("k", k4), ("v", v4)):
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device}, q on {dev}: all on one device")
    B, S_q, H, D = q4.shape
    if D not in HEAD_DIMS:
        raise ValueError(f"head_dim (the last dim of q) must be one of {HEAD_DIMS} for "
                         f"precision='fp8', got {D}")
    if k4.shape[0] != B or k4.shape[2] != H or k4.shape[3] != D:
        raise ValueError(f"k must match q's batch, heads and head_dim {(B, H, D)}, got "
                         f"{(k4.shape[0], k4.shape[2], k4.shape[3])}")
    if tuple(v4.shape) != tuple(k4.shape):
        raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    S_kv = k4.shape[1]
    if S_q == 0 or S_kv == 0 or B == 0 or H == 0:
        raise ValueError(f"empty attention: q {tuple(q.shape)}, k {tuple(k.shape)}")
    qs = _check_scale(q_scale, "q_scale", "q", (B, H, S_q), dev)
    ks = _check_scale(k_scale, "k_scale", "k", (B, H, S_kv), dev)
    if check_scale_values:
        for name, t in (("q_scale", qs), ("k_scale", ks)):
            _check_scale_values(t, name)
    if window is None:
        left = right = -1
    else:
        left, right = parse_window(window)
        if S_q != S_kv:
            raise ValueError(f"window needs as many queries as keys (the band is around the "
                             f"diagonal), got {S_q} and {S_kv}")
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (
            math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite float or None, got {scale!r}")
    km = _check_key_mask(key_mask, B, S_kv, dev)
    return Plan(q4, k4, v4, qs, ks, float(scale), left, right, layout, km)


def _kernel_ok(p: Plan) -> bool:
    if backend.INTERPRET:
        return p.q.device.type == "cpu"
    return p.q.is_cuda and _sm90(p.q.device)  # cached a device: no query a call


def launch(p: Plan, settings: Optional[Settings] = None) -> Tensor:
    """Run the 8-bit kernel of ``p``; the output in the caller's layout, contiguous."""
    from ditfuse.kernels.attention_fp8 import _attention_8bit_kernel

    B, S_q, H, D = p.q.shape
    S_kv = p.k.shape[1]
    st = settings or launch_settings(D, p.q.dtype, p.key_mask is not None)
    vt, vscale = quantize_v(p.v)
    shape = (B, S_q, H, D) if p.layout == "bshd" else (B, H, S_q, D)
    out = _new_out(shape, p.v.dtype, p.v.device)
    o4 = out if p.layout == "bshd" else out.transpose(1, 2)
    left, right = _band_sides(p.left, p.right, S_kv)
    grid = (triton_cdiv(S_q, st.block_m) * B * H,)  # query tiles fastest (the kernel's note)
    ks = p.k_scale if p.key_mask is None else _signed_scales(p)
    _attention_8bit_kernel[grid](
        p.q, p.k, vt, p.q_scale, ks, vscale, o4,
        S_q, S_kv, vt.shape[3], H, p.scale, left, right,
        *p.q_scale.stride(), *ks.stride(), *p.q.stride(), *p.k.stride(), *o4.stride(),
        D=D, BLOCK_M=st.block_m, BLOCK_N=st.block_n,
        QK_INT=p.q.dtype == torch.int8, BAND=left < S_kv or right < S_kv,
        KMASK=p.key_mask is not None,
        num_warps=st.num_warps, num_stages=st.num_stages)
    return out


def _band_sides(left: int, right: int, S_kv: int):
    """The band's sides as the kernel takes them: a side of at least S_kv (or -1) reaches every
    key, and is passed as S_kv -- the kernel adds a side to a row index in int32, where a side
    near 2^31 wrapped around and emptied the band."""
    return tuple(S_kv if x < 0 or x >= S_kv else x for x in (left, right))


def _signed_scales(p: Plan) -> Tensor:
    """The key mask carried by the key scales' sign, fp32 (B, H, S_kv): the scale of a kept
    key (> 0; a zero or NaN one stays kept), -1 for a dropped one -- the kernel reads no mask of its own (a mask
    loaded a column took the registers of a pipeline stage: 40 B of spill)."""
    return torch.where(p.key_mask.view(torch.bool)[:, None, :], p.k_scale, -1.0)


def _new_out(shape, dtype, device) -> Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def run(p: Plan) -> Tensor:
    """The Triton kernel where it runs (sm_90, or the interpreter on the CPU), else the
    PyTorch emulation of the same quantization."""
    if _kernel_ok(p):
        return launch(p)
    km = None if p.key_mask is None else p.key_mask.view(torch.bool)
    out = attention_8bit_core(p.q, p.k, p.v, p.q_scale, p.k_scale, scale=p.scale,
                              left=p.left, right=p.right, key_mask=km)
    return out if p.layout == "bshd" else out.transpose(1, 2).contiguous()


def _quantize_qk(q, k, layout: str):
    """16-bit q / k -> int8 with per-token scales (:func:`quantize_per_token`, each apart)."""
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in ACT_DTYPES:
            raise TypeError(f"{name}.dtype must be float16 / bfloat16 (quantized here) or "
                            f"int8 / float8_e4m3fn with {name}_scale, got {t.dtype}")
    if q.dtype != k.dtype:
        raise TypeError(f"q and k must share one dtype, got {q.dtype} and {k.dtype}")
    if q.dim() != 4 or k.dim() != 4:
        want = "(B, S, H, D)" if layout == "bshd" else "(B, H, S, D)"
        raise ValueError(f"q and k must be 4-D {want}, got {tuple(q.shape)} and "
                         f"{tuple(k.shape)}")
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"head_dim (the last dim of q) must be one of {HEAD_DIMS} for "
                         f"precision='fp8', got {q.shape[-1]}")
    if q.device != k.device:
        raise ValueError(f"k is on {k.device}, q on {q.device}: all on one device")
    if torch.compiler.is_compiling():
        (q8, qs), (k8, ks) = (quantize_per_token_op(x, layout) for x in (q, k))
    else:
        (q8, qs), (k8, ks) = (quantize_per_token(x, layout) for x in (q, k))
    return q8, k8, qs, ks


def quantize_per_token(x: Tensor, layout: str = "bshd"):
    """16-bit ``x`` ((B, S, H, D) or, ``layout="bhsd"``, (B, H, S, D); any strides) -> int8
    values in x's shape (contiguous) and fp32 scales (B, H, S): bitwise
    :func:`ditfuse.reference.quantize_per_token` (``"int8"``) -- ``scale = amax / 127`` of
    each token's head row, ``round_half_even(x * 127 / amax)``, NaN scale for a row holding a
    NaN. q and k are quantized apart (any sequence lengths, q and k may be one tensor)."""
    from ditfuse.kernels.attention_fp8 import _qk_quant_kernel

    x4 = x if layout == "bshd" else x.transpose(1, 2)
    B, S, H, D = x4.shape
    y = torch.empty(x.shape, dtype=torch.int8, device=x.device)
    y4 = y if layout == "bshd" else y.transpose(1, 2)
    scales = torch.empty(B, H, S, dtype=torch.float32, device=x.device)
    if y.numel():
        grid = (B * H, triton_cdiv(S, QK_BLOCK))
        _qk_quant_kernel[grid](x4, y4, scales, S, H, *x4.stride(), *y4.stride(), D=D,
                               BLOCK_S=QK_BLOCK, num_warps=4)
    return y, scales


@library.op("ditfuse::quantize_per_token_int8")
def quantize_per_token_op(x: Tensor, layout: str) -> List[Tensor]:
    return list(quantize_per_token(x, layout))


@quantize_per_token_op.register_fake
def _(x, layout):
    B, S, H = (x.shape[0], x.shape[1], x.shape[2]) if layout == "bshd" else (
        x.shape[0], x.shape[2], x.shape[1])
    return [torch.empty(x.shape, dtype=torch.int8, device=x.device),
            torch.empty(B, H, S, dtype=torch.float32, device=x.device)]


def _check_before_quantizing(q, k, v, window, scale, layout, key_mask) -> None:
    """Every argument the 8-bit call checks, before :func:`quantize_per_token` quantizes
    16-bit q / k (no kernel runs on a call that then fails): :func:`plan` on zero-stride int8 / fp32 stand-ins
    of the quantized q / k and their scales (shapes, dtypes and devices only, no memory)."""
    if not (isinstance(k, Tensor) and k.dtype == q.dtype and q.dim() == 4 and k.dim() == 4):
        return  # _quantize_qk names the problem
    q4, k4 = (q, k) if layout != "bhsd" else (q.transpose(1, 2), k.transpose(1, 2))
    (B, S_q, H, _), S_kv = q4.shape, k4.shape[1]

    def stand_in(x, dtype):
        return torch.empty((), dtype=dtype, device=x.device).expand(x.shape)

    def scales(S):
        return torch.empty((), dtype=torch.float32, device=q.device).expand(B, H, S)

    plan(stand_in(q, torch.int8), stand_in(k, torch.int8), v, q_scale=scales(S_q),
         k_scale=scales(S_kv), window=window, scale=scale, layout=layout, key_mask=key_mask,
         check_scale_values=False)


def _check_grad(*ts):
    if torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in ts):
        raise RuntimeError("ditfuse.attention is inference-only (no backward): call it under "
                           "torch.no_grad() or torch.inference_mode()")


def attention(q, k, v, *, precision=None, q_scale=None, k_scale=None, window=None,
              scale=None, layout="bshd", key_mask=None):
    r"""Softmax attention of every query over the keys (or over a band of them).

    Inference-only (no backward).

    Parameters
    ----------
    q, k, v : Tensor
        ``(B, S, H, D)`` (``layout="bshd"``) or ``(B, H, S, D)`` (``"bhsd"``), any strides;
        q may have another sequence length than k / v. 16-bit (fp16 / bf16) -- or, with
        ``precision="fp8"``, q and k int8 / float8_e4m3fn as
        ``ditfuse.qk_norm_rope(..., quantize=...)`` writes them, with their scales.
    precision : {None, "fp8"}
        ``None``: the exact 16-bit path -- PyTorch's ``scaled_dot_product_attention`` (its
        best backend), or :func:`ditfuse.sliding_window_attention` with a ``window``.
        ``"fp8"``: 8-bit tensor cores on sm_90 (head_dim 64 or 128): Q K^T in int8 (e4m3
        for e4m3 inputs) with per-token scales, fp32 online softmax, P and V in e4m3 (V with
        one scale per (batch, head, channel), quantized here), P V accumulated in fp32
        across key tiles; output in v's dtype. Elsewhere the same quantization emulated in
        PyTorch (:func:`ditfuse.reference.attention_8bit_core`).
    q_scale, k_scale : Tensor, optional
        float32 ``(B, H, S)``, positive and finite (one per batch, head and token; ``q = q_8bit
        * q_scale``; NaN for a token holding a NaN), any strides: required with 8-bit q / k,
        not accepted with 16-bit ones (those are quantized here, q and k apart:
        :func:`quantize_per_token`). A zero, negative or infinite scale is refused (ValueError)
        where that costs no device sync -- eager, CPU tensors; on a GPU, under torch.compile
        and in a CUDA-graph capture it is not checked (a zero scale still gives NaN-free
        output: masked scores are set to -inf after the scales multiply).
    window : int or (int, int), optional
        Only keys ``i - left <= j <= i + right`` (``-1``, or a side ``>= S_kv``: unbounded);
        needs as many queries as keys.
    scale : float, optional
        Softmax scale; default ``1 / sqrt(D)``.
    layout : {"bshd", "bhsd"}
    key_mask : Tensor, optional
        bool ``(B, S_kv)``: the keys each batch entry attends (``False``: dropped, as
        diffusers' text-padding masks of HunyuanVideo and Qwen-Image drop padded tokens;
        SDPA's ``attn_mask`` of shape ``(B, 1, 1, S_kv)``). A query whose every key is
        dropped gets zeros (SDPA: NaN).

    Returns
    -------
    Tensor
        ``(B, S_q, H, D)`` or ``(B, H, S_q, D)`` (q's layout), contiguous, v's dtype.

    Notes
    -----
    Accuracy of ``"fp8"`` (H200, random normal Q/K/V and Q/K after RMSNorm, against fp64):
    cosine similarity and relative L2 error in docs/attention_fp8.md; the kernel's operands
    are exactly :func:`ditfuse.reference.quantize_per_token`'s and
    :func:`quantize_v`'s, so the emulation differs from it only in summation order and where
    the online softmax rescales. The row sum is the sum of the rounded P, so the output lies
    within the range of V's quantized values. NaN propagates as in softmax attention: a NaN
    in q / k makes its token's scale NaN (the rows attending it NaN), one in V its channel's
    scale (that channel NaN).
    """
    _check_precision(precision)
    _check_grad(q, k, v, q_scale, k_scale)
    if precision is None:
        if q_scale is not None or k_scale is not None:
            raise ValueError("q_scale / k_scale go with precision='fp8' (8-bit q / k)")
        if window is not None:
            if key_mask is not None:
                raise ValueError("key_mask with window: not supported by the 16-bit band "
                                 "kernel (precision='fp8' takes both)")
            return sliding_window_attention(q, k, v, window, scale=scale, layout=layout)
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        t = (lambda x: x.transpose(1, 2)) if layout == "bshd" else (lambda x: x)
        mask = None
        if key_mask is not None:
            _check_key_mask(key_mask, q.shape[0], k.shape[1 if layout == "bshd" else 2],
                            q.device)
            mask = key_mask[:, None, None, :]
        o = F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=mask, scale=scale)
        return t(o).contiguous()
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    here = isinstance(q, Tensor) and q.dtype in ACT_DTYPES
    if here:
        if q_scale is not None or k_scale is not None:
            raise ValueError("q_scale / k_scale are for 8-bit q / k; 16-bit q and k are "
                             "quantized here (pass neither)")
        _check_before_quantizing(q, k, v, window, scale, layout, key_mask)
        if _ws_ok(q, k, window, key_mask):
            s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
            if torch.compiler.is_compiling():
                return attention_8bit_ws_op(q, k, v, s, layout)
            return run_ws(q, k, v, s, layout)
        q, k, q_scale, k_scale = _quantize_qk(q, k, layout)
    if torch.compiler.is_compiling():
        return _via_op(q, k, v, q_scale, k_scale, window, scale, layout, key_mask)
    return run(plan(q, k, v, q_scale=q_scale, k_scale=k_scale, window=window, scale=scale,
                    layout=layout, key_mask=key_mask, check_scale_values=not here))


def _ws_ok(q: Tensor, k: Tensor, window, key_mask) -> bool:
    """The warp-specialized kernel takes a 16-bit call on sm_90 without a window or a key
    mask (the Triton kernel takes those, and 8-bit q / k with per-token key scales)."""
    return (window is None and key_mask is None and not backend.INTERPRET and q.is_cuda
            and isinstance(k, Tensor) and k.dtype == q.dtype and _sm90(q.device))


def run_ws(q: Tensor, k: Tensor, v: Tensor, scale: float, layout: str) -> Tensor:
    """16-bit q / k / v (checked) -> the warp-specialized kernel's output in q's layout,
    contiguous: q int8 a token (:func:`quantize_per_token`), K int8 a 128-key tile after
    the mean key, V e4m3 a channel (:mod:`ditfuse.ops.attention_fp8_ws`)."""
    from ditfuse.ops import attention_fp8_ws as ws

    q8, qs = quantize_per_token(q, layout)
    t = (lambda x: x) if layout == "bshd" else (lambda x: x.transpose(1, 2))
    q4, k4, v4 = t(q8), t(k), t(v)
    out = _new_out(q.shape, v.dtype, v.device)
    ws.launch(q4, qs, k4, v4, t(out), scale)
    return out


@library.op("ditfuse::attention_8bit_ws")
def attention_8bit_ws_op(q: Tensor, k: Tensor, v: Tensor, scale: float,
                         layout: str) -> Tensor:
    return run_ws(q, k, v, scale, layout)


@attention_8bit_ws_op.register_fake
def _(q, k, v, scale, layout):
    return torch.empty(q.shape, dtype=v.dtype, device=v.device)


def _op_window(left: int, right: int):
    return None if left < 0 and right < 0 else (left, right)


@library.op("ditfuse::attention_8bit")
def attention_8bit_op(q: Tensor, k: Tensor, v: Tensor, q_scale: Tensor, k_scale: Tensor,
                      left: int, right: int, scale: Optional[float], layout: str,
                      key_mask: Optional[Tensor]) -> Tensor:
    return run(plan(q, k, v, q_scale=q_scale, k_scale=k_scale, window=_op_window(left, right),
                    scale=scale, layout=layout, key_mask=key_mask))


@attention_8bit_op.register_fake
def _(q, k, v, q_scale, k_scale, left, right, scale, layout, key_mask):
    p = plan(q, k, v, q_scale=q_scale, k_scale=k_scale, window=_op_window(left, right),
             scale=scale, layout=layout, key_mask=key_mask)
    B, S_q, H, D = p.q.shape
    shape = (B, S_q, H, D) if layout == "bshd" else (B, H, S_q, D)
    return torch.empty(shape, dtype=v.dtype, device=v.device)


def _via_op(q, k, v, q_scale, k_scale, window, scale, layout, key_mask=None):
    left, right = (-1, -1) if window is None else parse_window(window)
    if scale is not None and not isinstance(scale, bool) and isinstance(scale, (int, float)):
        scale = float(scale)
    return attention_8bit_op(q, k, v, q_scale, k_scale, left, right, scale, layout, key_mask)
