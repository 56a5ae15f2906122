"""8-bit tensor-core attention on Hopper: validate -> launch (the Triton kernel, or the
warp-specialized one through :func:`run_ws`), the per-token quantizer of 16-bit q / k, and
at the end the ``torch.library`` ops with their fakes. The public entry point,
``ditfuse.attention(..., precision="fp8")``, is :mod:`ditfuse.ops.attention_api`.

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
from typing import List, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from ditfuse.ops.attention import _sm90, parse_window
from ditfuse.ops.attention_fp8_ws import quantize_v
from ditfuse.reference import attention_8bit_core
from ditfuse.runtime import backend, library

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

    q: Tensor  # int8 / e4m3 (B, S_q, H, D)
    k: Tensor  # int8 / e4m3 (B, S_kv, H, D)
    v: Tensor  # 16-bit (B, S_kv, H, D)
    q_scale: Tensor  # fp32 (B, H, S_q), any strides
    k_scale: Tensor  # fp32 (B, H, S_kv)
    scale: float
    left: int  # -1: unbounded
    right: int
    layout: str
    key_mask: Optional[Tensor] = None  # uint8 view (B, S_kv) of the bool mask: keys kept

    @property
    def band(self) -> bool:
        return self.left >= 0 or self.right >= 0

    @property
    def out_shape(self) -> tuple:
        """The output's shape: q's in the caller's layout."""
        B, S_q, H, D = self.q.shape
        return (B, S_q, H, D) if self.layout == "bshd" else (B, H, S_q, D)


@dataclass(frozen=True)
class Settings:
    """One launch of the Triton kernel: the query and key tiles, warps, K / V stages."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def launch_settings(D: int, qk_dtype: torch.dtype = torch.int8, key_mask: bool = False) -> Settings:
    """The :class:`Settings` of one call (docs/design/attention_fp8.md): 128 x 128 tiles on
    two warpgroups, three stages of K / V in flight; two stages for e4m3 q / k and 64-key
    tiles under a key mask, whose key loops (with the rounded P's row sum) spill otherwise
    (sm_90a builds, ``test_sm90_builds``)."""
    if key_mask:
        return Settings(block_m=128, block_n=64, num_warps=8, num_stages=3)
    e4m3 = qk_dtype == torch.float8_e4m3fn
    return Settings(block_m=128, block_n=128, num_warps=8, num_stages=2 if e4m3 else 3)


def _heads(x, name: str, layout: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 4:
        want = "(B, S, H, D)" if layout == "bshd" else "(B, H, S, D)"
        raise ValueError(
            f"{name} must be 4-D {want} (layout={layout!r}), got shape {tuple(x.shape)}"
        )
    return x if layout == "bshd" else x.transpose(1, 2)


def _check_tensor(
    t, name, dtype, dims: str, shape: tuple, on: str, device, dtype_why="", shape_why=""
):
    """``t`` a tensor of ``dtype``, of ``shape`` (its ``dims`` named) and on ``device`` (that
    of ``on``), checked in that order; ``dtype_why`` / ``shape_why``: what they mean."""
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name}.dtype must be {dtype}{dtype_why}, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(
            f"{name} must have shape {dims} = {shape}{shape_why}, got {tuple(t.shape)}"
        )
    if t.device != device:
        raise ValueError(f"{name} is on {t.device}, {on} on {device}: all on one device")
    return t


def _check_scale(s, name: str, of: str, shape: tuple, device) -> Tensor:
    if s is None:
        raise ValueError(
            f"{name} is required with 8-bit {of} ({of}.dtype is 8-bit): the "
            f"per-token scales, float32 of shape (B, H, S) = {shape}, as "
            f"ditfuse.qk_norm_rope(..., quantize=...) returns them"
        )
    why = f" (one scale per batch, head and token of {of})"
    return _check_tensor(s, name, torch.float32, "(B, H, S)", shape, of, device, shape_why=why)


def _check_scale_values(s: Tensor, name: str) -> None:
    """Positive and finite scales -- or NaN ones, which a quantizer writes for a token holding
    a NaN (the output is NaN there, as softmax attention's). Checked where it costs no device
    synchronisation: eager, on the CPU; never while tracing (torch.compile, fake tensors,
    meta) or in a CUDA-graph capture, and not for GPU tensors, whose check would wait for
    the stream. The kernel gives NaN-free outputs for a zero scale anyway (masked scores are
    set to -inf after the scales multiply)."""
    if (
        s.device.type != "cpu"
        or torch.compiler.is_compiling()
        or isinstance(s, torch._subclasses.FakeTensor)
        or _capturing()
    ):
        return
    bad = ~((s > 0) & (s < math.inf)) & (s == s)
    if bool(bad.any()):
        v = s[bad][0].item()
        raise ValueError(
            f"{name} must be positive and finite (or NaN, from a token holding a "
            f"NaN), got {v} at index {tuple(bad.nonzero()[0].tolist())}"
        )


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _check_key_mask(m, B: int, S_kv: int, device) -> Optional[Tensor]:
    if m is None:
        return None
    why = " (True: the key is attended)"
    m = _check_tensor(m, "key_mask", torch.bool, "(B, S_kv)", (B, S_kv), "q", device, dtype_why=why)
    return m.view(torch.uint8)


class Options(NamedTuple):
    """The keywords of an 8-bit call (:func:`ditfuse.ops.attention_api.attention`'s, whose
    signature spells them out for readers and tools), their defaults written once for
    :func:`plan`. ``check_scale_values``: the scales' values too (:func:`_check_scale_values`;
    off for the scales :func:`quantize_per_token` wrote, NaN / inf for a token holding one)."""

    q_scale: Optional[Tensor] = None
    k_scale: Optional[Tensor] = None
    window: object = None
    scale: Optional[float] = None
    layout: str = "bshd"
    key_mask: Optional[Tensor] = None
    check_scale_values: bool = True


def plan(q, k, v, **options) -> Plan:
    """Validate an 8-bit call whose q / k are already 8-bit (``options``: :class:`Options`)."""
    q_scale, k_scale, window, scale, layout, key_mask, check_scale_values = Options(**options)
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    q4, k4, v4 = _heads(q, "q", layout), _heads(k, "k", layout), _heads(v, "v", layout)
    for name, t in (("q", q4), ("k", k4)):
        if t.dtype not in QK_8BIT:
            raise TypeError(
                f"{name}.dtype must be float16 / bfloat16 (quantized here), or "
                f"int8 / float8_e4m3fn with {name}_scale, one dtype for q and k; "
                f"got {t.dtype}"
            )
    if q4.dtype != k4.dtype:
        raise TypeError(f"q and k must share one 8-bit dtype, got {q4.dtype} and {k4.dtype}")
    if v4.dtype not in ACT_DTYPES:
        raise TypeError(f"v.dtype must be float16 or bfloat16 (the output's dtype), got {v4.dtype}")
    dev = q4.device
    for name, t in (("k", k4), ("v", v4)):
        if t.device != dev:
            raise ValueError(f"{name} is on {t.device}, q on {dev}: all on one device")
    B, S_q, H, D = q4.shape
    if D not in HEAD_DIMS:
        raise ValueError(
            f"head_dim (the last dim of q) must be one of {HEAD_DIMS} for precision='fp8', got {D}"
        )
    if k4.shape[0] != B or k4.shape[2] != H or k4.shape[3] != D:
        raise ValueError(
            f"k must match q's batch, heads and head_dim {(B, H, D)}, got "
            f"{(k4.shape[0], k4.shape[2], k4.shape[3])}"
        )
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
            raise ValueError(
                f"window needs as many queries as keys (the band is around the "
                f"diagonal), got {S_q} and {S_kv}"
            )
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    elif (
        isinstance(scale, bool)
        or not isinstance(scale, (int, float))
        or not (math.isfinite(scale) and scale > 0)
    ):
        raise ValueError(f"scale must be a positive finite float or None, got {scale!r}")
    km = _check_key_mask(key_mask, B, S_kv, dev)
    return Plan(q4, k4, v4, qs, ks, float(scale), left, right, layout, km)


def triton_kernel_runs(device: torch.device) -> bool:
    """Whether :func:`run` launches the Triton kernel on ``device`` (the one place that
    decides it): an sm_90 GPU, or Triton's interpreter on the CPU; elsewhere the PyTorch
    emulation of the same scheme runs."""
    if backend.INTERPRET:
        return device.type == "cpu"
    return device.type == "cuda" and _sm90(device)


def _kernel_ok(p: Plan) -> bool:
    return triton_kernel_runs(p.q.device)


def launch(p: Plan, settings: Optional[Settings] = None) -> Tensor:
    """Run the 8-bit kernel of ``p``; the output in the caller's layout, contiguous."""
    from ditfuse.kernels.attention_fp8 import _attention_8bit_kernel

    B, S_q, H, D = p.q.shape
    S_kv = p.k.shape[1]
    st = settings or launch_settings(D, p.q.dtype, p.key_mask is not None)
    vt, vscale = quantize_v(p.v)
    out = _new_out(p.out_shape, p.v.dtype, p.v.device)
    o4 = out if p.layout == "bshd" else out.transpose(1, 2)
    left, right = _band_sides(p.left, p.right, S_kv)
    grid = (triton_cdiv(S_q, st.block_m) * B * H,)  # query tiles fastest (the kernel's note)
    ks = p.k_scale if p.key_mask is None else _signed_scales(p)
    _attention_8bit_kernel[grid](
        p.q,
        p.k,
        vt,
        p.q_scale,
        ks,
        vscale,
        o4,
        S_q,
        S_kv,
        vt.shape[3],
        H,
        p.scale,
        left,
        right,
        p.q_scale.stride(),
        ks.stride(),
        p.q.stride(),
        p.k.stride(),
        o4.stride(),
        D=D,
        BLOCK_M=st.block_m,
        BLOCK_N=st.block_n,
        QK_INT=p.q.dtype == torch.int8,
        BAND=left < S_kv or right < S_kv,
        KMASK=p.key_mask is not None,
        num_warps=st.num_warps,
        num_stages=st.num_stages,
    )
    return out


def _band_sides(left: int, right: int, S_kv: int):
    """The band's sides as the kernel takes them: a side of at least S_kv (or -1) reaches every
    key, and is passed as S_kv -- the kernel adds a side to a row index in int32, where a side
    near 2^31 wrapped around and emptied the band."""
    return tuple(S_kv if x < 0 or x >= S_kv else x for x in (left, right))


def _signed_scales(p: Plan) -> Tensor:
    """The key mask carried by the key scales' sign, fp32 (B, H, S_kv): the scale of a kept
    key (> 0; a zero or NaN one stays kept), -1 for a dropped one -- the kernel reads no mask
    of its own (a mask loaded a column took the registers of a pipeline stage: 40 B of
    spill)."""
    return torch.where(p.key_mask.view(torch.bool)[:, None, :], p.k_scale, -1.0)


def _new_out(shape, dtype, device) -> Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def run(p: Plan) -> Tensor:
    """The Triton kernel where it runs (:func:`triton_kernel_runs`), else the PyTorch
    emulation of the same quantization."""
    if _kernel_ok(p):
        return launch(p)
    km = None if p.key_mask is None else p.key_mask.view(torch.bool)
    out = attention_8bit_core(
        p.q, p.k, p.v, p.q_scale, p.k_scale, scale=p.scale, left=p.left, right=p.right, key_mask=km
    )
    return out if p.layout == "bshd" else out.transpose(1, 2).contiguous()


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
        _qk_quant_kernel[grid](
            x4, y4, scales, S, H, x4.stride(), y4.stride(), D=D, BLOCK_S=QK_BLOCK, num_warps=4
        )
    return y, scales


@library.op("ditfuse::quantize_per_token_int8")
def quantize_per_token_op(x: Tensor, layout: str) -> List[Tensor]:
    return list(quantize_per_token(x, layout))


@quantize_per_token_op.register_fake
def _(x, layout):
    B, S, H = (
        (x.shape[0], x.shape[1], x.shape[2])
        if layout == "bshd"
        else (x.shape[0], x.shape[2], x.shape[1])
    )
    return [
        torch.empty(x.shape, dtype=torch.int8, device=x.device),
        torch.empty(B, H, S, dtype=torch.float32, device=x.device),
    ]


def run_ws(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    layout: str,
    key_mask: Optional[Tensor] = None,
    q_scale: Optional[Tensor] = None,
    rows8: bool = False,
):
    """16-bit q / k / v (checked) -> the warp-specialized kernel's output in q's layout,
    contiguous: q int8 a token (:func:`quantize_per_token`), K int8 a 128-key tile after
    the mean key, V e4m3 a channel (:mod:`ditfuse.ops.attention_fp8_ws`). With ``q_scale``
    (fp32 (B, H, S_q), checked), q is int8 already, quantized a token as
    :func:`quantize_per_token` does (the form ``ditfuse.qk_norm_rope(..., quantize="int8")``
    writes), and goes to the kernel as it is -- through a contiguous copy only where
    its strides are not the 16-byte multiples the kernel's TMA loads need.

    ``key_mask`` (bool (B, S_kv), checked): each batch entry attends only the keys it keeps.
    They are compacted on the device (:class:`ditfuse.ops.attention_fp8_ws.Keys`: no host
    synchronisation, so also inside a CUDA graph capture) and the quantizers read them
    through that index, so K's mean and tile scales and V's scales are of the kept keys;
    softmax does not depend on the keys left out, so the kernel needs no mask, only each
    entry's key count. An entry that keeps no key gets zeros.

    ``rows8`` (layout "bshd"): (e4m3 (B, S_q, H, D), fp32 (B, S_q)) instead, the 16-bit
    output quantized in the kernel's epilogue with one scale a batch entry, bitwise
    :func:`ditfuse.reference.attention_out_rows8` of the 16-bit output."""
    from ditfuse.ops import attention_fp8_ws as ws

    t = (lambda x: x) if layout == "bshd" else (lambda x: x.transpose(1, 2))
    if q_scale is None:
        q8, qs = quantize_per_token(q, layout)
    else:
        q8, qs = (q if _tma_ok(t(q)) else t(t(q).contiguous())), q_scale
    keys = ws.Keys.from_mask(key_mask)
    if rows8:
        out = _new_out(q.shape, torch.float8_e4m3fn, v.device)
        out_scale = torch.empty(q.shape[:2], dtype=torch.float32, device=v.device)
        ws.launch(q8, qs, k, v, out, scale, keys, out_scale=out_scale)
        return out, out_scale
    out = _new_out(q.shape, v.dtype, v.device)
    ws.launch(t(q8), qs, t(k), t(v), t(out), scale, keys)
    return out


def _tma_ok(x4: Tensor) -> bool:
    """Whether an 8-bit (B, S, H, D) view can be a TMA descriptor's tensor as it is: channels
    contiguous, every other stride and the base 16-byte aligned."""
    return (
        x4.stride(3) == 1 and all(s % 16 == 0 for s in x4.stride()[:3]) and x4.data_ptr() % 16 == 0
    )


@library.op("ditfuse::attention_8bit_ws")
def attention_8bit_ws_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    layout: str,
    key_mask: Optional[Tensor],
    q_scale: Optional[Tensor],
) -> Tensor:
    return run_ws(q, k, v, scale, layout, key_mask, q_scale)


@attention_8bit_ws_op.register_fake
def _(q, k, v, scale, layout, key_mask, q_scale):
    return torch.empty(q.shape, dtype=v.dtype, device=v.device)


@library.op("ditfuse::attention_8bit_ws_rows8")
def attention_8bit_ws_rows8_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float,
    key_mask: Optional[Tensor],
    q_scale: Optional[Tensor],
) -> Tuple[Tensor, Tensor]:
    """:func:`run_ws` with ``rows8`` (layout "bshd")."""
    return run_ws(q, k, v, scale, "bshd", key_mask, q_scale, rows8=True)


@attention_8bit_ws_rows8_op.register_fake
def _(q, k, v, scale, key_mask, q_scale):
    return (
        torch.empty(q.shape, dtype=torch.float8_e4m3fn, device=v.device),
        torch.empty(q.shape[:2], dtype=torch.float32, device=v.device),
    )


@library.op("ditfuse::attention_out_rows8")
def _out_rows8_op(o: Tensor, v: Tensor, key_mask: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    from ditfuse.reference import attention_out_rows8

    return attention_out_rows8(o, v, key_mask)


@_out_rows8_op.register_fake
def _(o, v, key_mask):
    return (
        torch.empty(o.shape, dtype=torch.float8_e4m3fn, device=o.device),
        torch.empty(o.shape[:2], dtype=torch.float32, device=o.device),
    )


def out_rows8(o: Tensor, v: Tensor, key_mask: Optional[Tensor] = None):
    """:func:`ditfuse.reference.attention_out_rows8` (through its op while tracing: its
    divisions must stay IEEE ones, which a compiled graph's need not be)."""
    if torch.compiler.is_compiling():
        return _out_rows8_op(o, v, key_mask)
    from ditfuse.reference import attention_out_rows8

    return attention_out_rows8(o, v, key_mask)


def _op_plan(q, k, v, q_scale, k_scale, left, right, scale, layout, key_mask) -> Plan:
    """The plan of an ``attention_8bit`` op call (the op's flat arguments; left = right = -1:
    no window)."""
    window = None if left < 0 and right < 0 else (left, right)
    return plan(
        q,
        k,
        v,
        q_scale=q_scale,
        k_scale=k_scale,
        window=window,
        scale=scale,
        layout=layout,
        key_mask=key_mask,
    )


@library.op("ditfuse::attention_8bit")
def attention_8bit_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_scale: Tensor,
    k_scale: Tensor,
    left: int,
    right: int,
    scale: Optional[float],
    layout: str,
    key_mask: Optional[Tensor],
) -> Tensor:
    return run(_op_plan(q, k, v, q_scale, k_scale, left, right, scale, layout, key_mask))


@attention_8bit_op.register_fake
def _(*args):
    p = _op_plan(*args)
    return torch.empty(p.out_shape, dtype=p.v.dtype, device=p.v.device)


def _via_op(q, k, v, q_scale, k_scale, window, scale, layout, key_mask=None):
    left, right = (-1, -1) if window is None else parse_window(window)
    if scale is not None and not isinstance(scale, bool) and isinstance(scale, (int, float)):
        scale = float(scale)
    return attention_8bit_op(q, k, v, q_scale, k_scale, left, right, scale, layout, key_mask)
