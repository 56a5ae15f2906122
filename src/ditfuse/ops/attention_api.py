"""``ditfuse.attention``: the one front door of attention. It routes a call to PyTorch's SDPA
or the band kernel of :mod:`ditfuse.ops.attention` (the exact 16-bit path), or to 8-bit
tensor-core attention (``precision="fp8"``): the warp-specialized sm_90 kernel for 16-bit
calls (or int8 q with a 16-bit k) without a window, key-masked ones included
(:func:`ditfuse.ops.attention_fp8.run_ws`: the kept keys compacted on the device), else q / k
quantized here where they are 16-bit and the Triton kernel of
:mod:`ditfuse.ops.attention_fp8` (or its PyTorch emulation where it cannot run). Every
argument is checked before anything is quantized or launched.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ditfuse.ops import attention_fp8 as fp8
from ditfuse.ops.attention import _sm90, sliding_window_attention
from ditfuse.ops.quantize_rows import Rows8
from ditfuse.runtime import backend

#: values of ``precision``: None the exact 16-bit path, "fp8" 8-bit tensor cores
PRECISIONS = (None, "fp8")


def _check_precision(precision):
    if not (precision is None or (isinstance(precision, str) and precision in PRECISIONS)):
        raise ValueError(
            f"precision must be None (the exact 16-bit path) or 'fp8', got {precision!r}"
        )


def _quantize_qk(q, k, layout: str):
    """16-bit q / k -> int8 with per-token scales
    (:func:`ditfuse.ops.attention_fp8.quantize_per_token`, each apart)."""
    for name, t in (("q", q), ("k", k)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in fp8.ACT_DTYPES:
            raise TypeError(
                f"{name}.dtype must be float16 / bfloat16 (quantized here) or "
                f"int8 / float8_e4m3fn with {name}_scale, got {t.dtype}"
            )
    if q.dtype != k.dtype:
        raise TypeError(f"q and k must share one dtype, got {q.dtype} and {k.dtype}")
    if q.dim() != 4 or k.dim() != 4:
        want = "(B, S, H, D)" if layout == "bshd" else "(B, H, S, D)"
        raise ValueError(f"q and k must be 4-D {want}, got {tuple(q.shape)} and {tuple(k.shape)}")
    if q.shape[-1] not in fp8.HEAD_DIMS:
        raise ValueError(
            f"head_dim (the last dim of q) must be one of {fp8.HEAD_DIMS} for "
            f"precision='fp8', got {q.shape[-1]}"
        )
    if q.device != k.device:
        raise ValueError(f"k is on {k.device}, q on {q.device}: all on one device")
    (q8, qs), (k8, ks) = (_per_token_int8(x, layout) for x in (q, k))
    return q8, k8, qs, ks


def _per_token_int8(x: Tensor, layout: str):
    """:func:`ditfuse.ops.attention_fp8.quantize_per_token`, through its op while tracing."""
    if torch.compiler.is_compiling():
        return fp8.quantize_per_token_op(x, layout)
    return fp8.quantize_per_token(x, layout)


def _stand_in(shape, dtype, device) -> Tensor:
    """A zero-stride tensor of ``shape`` (no memory): what ``plan`` checks, before the tensor
    it stands for is made."""
    return torch.empty((), dtype=dtype, device=device).expand(shape)


def _check_before_quantizing(q, k, v, **opts) -> None:
    """Every argument the 8-bit call checks, before 16-bit q / k are quantized (no kernel
    runs on a call that then fails): :func:`ditfuse.ops.attention_fp8.plan` on zero-stride
    int8 / fp32 stand-ins of the quantized q / k and their scales (shapes, dtypes and
    devices only, no memory); ``opts``: the call's other arguments, as ``plan`` takes them."""
    if not (isinstance(k, Tensor) and k.dtype == q.dtype and q.dim() == 4 and k.dim() == 4):
        return  # _quantize_qk names the problem
    q4, k4 = (q, k) if opts["layout"] != "bhsd" else (q.transpose(1, 2), k.transpose(1, 2))
    (B, S_q, H, _), S_kv = q4.shape, k4.shape[1]
    f32 = torch.float32
    fp8.plan(
        _stand_in(q.shape, torch.int8, q.device),
        _stand_in(k.shape, torch.int8, k.device),
        v,
        q_scale=_stand_in((B, H, S_q), f32, q.device),
        k_scale=_stand_in((B, H, S_kv), f32, q.device),
        check_scale_values=False,
        **opts,
    )


def _check_grad(*ts):
    if torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in ts):
        raise RuntimeError(
            "ditfuse.attention is inference-only (no backward): call it under "
            "torch.no_grad() or torch.inference_mode()"
        )


def attention(
    q,
    k,
    v,
    *,
    precision=None,
    q_scale=None,
    k_scale=None,
    window=None,
    scale=None,
    layout="bshd",
    key_mask=None,
    quantize_out=None,
):
    r"""Softmax attention of every query over the keys (or over a band of them).

    Inference-only (no backward).

    Parameters
    ----------
    q, k, v : Tensor
        ``(B, S, H, D)`` (``layout="bshd"``) or ``(B, H, S, D)`` (``"bhsd"``), any strides;
        q may have another sequence length than k / v. 16-bit (fp16 / bf16) -- or, with
        ``precision="fp8"``, q and k int8 / float8_e4m3fn as
        ``ditfuse.qk_norm_rope(..., quantize=...)`` writes them, with their scales, or such
        an 8-bit q (with ``q_scale``) and a 16-bit k, which is quantized here.
    precision : {None, "fp8"}
        ``None``: the exact 16-bit path -- PyTorch's ``scaled_dot_product_attention`` (its
        best backend), or :func:`ditfuse.sliding_window_attention` with a ``window``.
        ``"fp8"``: 8-bit attention (head_dim 64 or 128): Q K^T in int8 (e4m3 for e4m3
        inputs) with per-token scales, fp32 online softmax, P and V in e4m3 (V with one
        scale per (batch, head, channel), quantized here), P V accumulated in fp32; output
        in v's dtype. On sm_90 tensor cores: the warp-specialized kernel for 16-bit calls
        and int8 q with 16-bit k, without a window (with a key mask, on each batch entry's
        kept keys, compacted on the device), the Triton kernel for the others (8-bit k, e4m3
        q, a window); elsewhere the
        same quantization emulated in PyTorch
        (:func:`ditfuse.reference.attention_8bit_core`).
    q_scale, k_scale : Tensor, optional
        float32 ``(B, H, S)``, positive and finite (one per batch, head and token; ``q = q_8bit
        * q_scale``; NaN for a token holding a NaN), any strides: required with 8-bit q / k,
        not accepted with 16-bit ones (those are quantized here, q and k apart:
        :func:`ditfuse.ops.attention_fp8.quantize_per_token`). A zero, negative or infinite
        scale is refused (ValueError) where that costs no device sync -- eager, CPU tensors;
        on a GPU, under torch.compile and in a CUDA-graph capture it is not checked (a zero
        scale still gives NaN-free output: masked scores are set to -inf after the scales
        multiply). ``q_scale`` alone, with an 8-bit q and a 16-bit k: k is quantized here
        as the kernel that runs takes it (the warp-specialized kernel's tiles for an int8 q,
        so the answer is bitwise that of the 16-bit call whose q quantizes to ``q``; else a
        token, in q's format).
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
    quantize_out : {None, "fp8"}
        ``"fp8"`` (with ``precision="fp8"``, layout ``"bshd"``): the output as an FP8
        linear takes it (an attention's output projection), a
        :class:`~ditfuse.ops.linear_fp8.Rows8`: the 16-bit output quantized to e4m3 with
        one scale a batch entry, ``amax / 448`` for every token, where ``amax`` is the
        largest |V| the entry attends (over its heads and channels), which bounds every
        output. On the warp-specialized kernel the quantization is its epilogue's (the
        16-bit output is never stored); elsewhere a pass after it. Bitwise
        :func:`ditfuse.reference.attention_out_rows8` of the 16-bit output the same route
        gives without it.

    Returns
    -------
    Tensor
        ``(B, S_q, H, D)`` or ``(B, H, S_q, D)`` (q's layout), contiguous, v's dtype; with
        ``quantize_out="fp8"`` a ``Rows8``: ``q`` e4m3 ``(B, S_q, H * D)``, contiguous,
        ``scale`` fp32 ``(B, S_q)``, ``dtype`` v's.

    Notes
    -----
    Accuracy of ``"fp8"`` (random normal Q/K/V and Q/K after RMSNorm, against fp64): cosine
    similarity and relative L2 error in docs/attention_fp8.md. The kernels' operands: q int8
    a token (bitwise :func:`ditfuse.reference.quantize_per_token`), V e4m3 a channel (bitwise
    :func:`ditfuse.reference.quantize_v_e4m3` but for the layout), K int8 a token (the Triton
    kernel) or, in the warp-specialized kernel, int8 a tile of 128 keys after the (batch,
    head)'s mean key (:func:`ditfuse.ops.attention_fp8_ws.quantize_k_blocks`); with those
    operands :func:`ditfuse.reference.attention_8bit_core` differs from either kernel only
    in summation order and where the online softmax rescales. The row sum is the sum of the
    rounded P, so the output lies within the range of V's quantized values. NaN propagates as
    in softmax attention: a NaN in q / k makes its token's scale NaN (the rows attending it
    NaN), one in V its channel's scale (that channel NaN). With 16-bit q / k and a single key,
    the answer is V's row for every query (softmax over one key is 1), returned exactly
    without a kernel.
    """
    _check_precision(precision)
    _check_grad(q, k, v, q_scale, k_scale)
    if quantize_out is not None:
        _check_quantize_out(quantize_out, precision, layout)
        out = _attention_8bit(q, k, v, q_scale, k_scale, window, scale, layout, key_mask, True)
        if isinstance(out, tuple):
            o8, o_scale = out
        else:
            o8, o_scale = fp8.out_rows8(out, v, key_mask)
        return Rows8(o8.flatten(2), o_scale, v.dtype)
    if precision is None:
        if q_scale is not None or k_scale is not None:
            raise ValueError("q_scale / k_scale go with precision='fp8' (8-bit q / k)")
        if window is not None:
            if key_mask is not None:
                raise ValueError(
                    "key_mask with window: not supported by the 16-bit band "
                    "kernel (precision='fp8' takes both)"
                )
            return sliding_window_attention(q, k, v, window, scale=scale, layout=layout)
        if layout not in fp8.LAYOUTS:
            raise ValueError(f"layout must be one of {fp8.LAYOUTS}, got {layout!r}")
        t = (lambda x: x.transpose(1, 2)) if layout == "bshd" else (lambda x: x)
        mask = None
        if key_mask is not None:
            fp8._check_key_mask(
                key_mask, q.shape[0], k.shape[1 if layout == "bshd" else 2], q.device
            )
            mask = key_mask[:, None, None, :]
        o = F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=mask, scale=scale)
        return t(o).contiguous()
    if layout not in fp8.LAYOUTS:
        raise ValueError(f"layout must be one of {fp8.LAYOUTS}, got {layout!r}")
    return _attention_8bit(q, k, v, q_scale, k_scale, window, scale, layout, key_mask)


def _check_quantize_out(quantize_out, precision, layout) -> None:
    if quantize_out != "fp8":
        raise ValueError(f"quantize_out must be None or 'fp8', got {quantize_out!r}")
    if precision != "fp8":
        raise ValueError("quantize_out='fp8' goes with precision='fp8'")
    if layout != "bshd":
        raise ValueError(
            f"quantize_out='fp8' needs layout='bshd' (a token's heads in one row), got {layout!r}"
        )


def _attention_8bit(q, k, v, q_scale, k_scale, window, scale, layout, key_mask, rows8=False):
    """``precision="fp8"`` (layout checked): the output, or with ``rows8`` the pair
    (e4m3, scales) where the warp-specialized kernel quantizes it, else the 16-bit output."""
    opts = dict(window=window, scale=scale, layout=layout, key_mask=key_mask)
    here = isinstance(q, Tensor) and q.dtype in fp8.ACT_DTYPES
    if here:
        if q_scale is not None or k_scale is not None:
            raise ValueError(
                "q_scale / k_scale are for 8-bit q / k; 16-bit q and k are "
                "quantized here (pass neither)"
            )
        _check_before_quantizing(q, k, v, **opts)
        if k.shape[1 if layout == "bshd" else 2] == 1:
            return _one_key(q, k, v, scale, layout, key_mask)
        if _ws_ok(q, k, window):
            s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
            return _ws(q, k, v, s, layout, key_mask, None, rows8)
        q, k, q_scale, k_scale = _quantize_qk(q, k, layout)
    elif _q8_k16(q, k):
        if k_scale is not None:
            raise ValueError(
                "k_scale is for an 8-bit k; a 16-bit k is quantized here (pass q_scale alone)"
            )
        _check_q8_k16(q, k, v, q_scale, **opts)
        if _ws_ok(q, k, window, q8=True):
            s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
            return _ws(q, k, v, s, layout, key_mask, q_scale, rows8)
        k, k_scale = _quantize_k_like(k, q.dtype, layout)
        here = True  # q_scale's values checked above, k's scales written here
    if torch.compiler.is_compiling():
        return fp8._via_op(q, k, v, q_scale, k_scale, **opts)
    return fp8.run(
        fp8.plan(q, k, v, q_scale=q_scale, k_scale=k_scale, check_scale_values=not here, **opts)
    )


def _ws(q, k, v, s: float, layout: str, key_mask, q_scale, rows8: bool):
    """The warp-specialized kernel (through its op while tracing)."""
    if torch.compiler.is_compiling():
        if rows8:
            return fp8.attention_8bit_ws_rows8_op(q, k, v, s, key_mask, q_scale)
        return fp8.attention_8bit_ws_op(q, k, v, s, layout, key_mask, q_scale)
    return fp8.run_ws(q, k, v, s, layout, key_mask, q_scale, rows8=rows8)


def _one_key(q: Tensor, k: Tensor, v: Tensor, scale, layout: str, key_mask) -> Tensor:
    """Attention over one key, exact: softmax is 1 (NaN for a NaN or infinite score), so
    every query gets V's row; zeros for a batch entry whose mask drops the key. Exact where
    the 8-bit kernel would round V to e4m3, and no launch (docs/design/attention_fp8.md, "One
    key")."""
    sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    s = (q.float() * k.float()).sum(-1, keepdim=True) * sc
    o = (s - s + 1.0) * v.float()
    if key_mask is not None:
        o = torch.where(key_mask.view(-1, 1, 1, 1), o, 0.0)
    return o.to(v.dtype).contiguous()


def _ws_ok(q: Tensor, k: Tensor, window, q8: bool = False) -> bool:
    """The warp-specialized kernel takes a 16-bit call on sm_90 without a window, with or
    without a key mask, and (``q8``) one of int8 q with 16-bit k (the Triton kernel takes
    band windows, 8-bit k with per-token key scales, and e4m3 q)."""
    q_ok = q.dtype == torch.int8 if q8 else isinstance(k, Tensor) and k.dtype == q.dtype
    return window is None and not backend.INTERPRET and q.is_cuda and q_ok and _sm90(q.device)


def _q8_k16(q, k) -> bool:
    """An 8-bit q (its scales given) with a 16-bit k, quantized here."""
    return (
        isinstance(q, Tensor)
        and isinstance(k, Tensor)
        and q.dtype in fp8.QK_8BIT
        and k.dtype in fp8.ACT_DTYPES
    )


def _check_q8_k16(q, k, v, q_scale, **opts):
    """Every argument of an 8-bit-q, 16-bit-k call, before k is quantized: the plan on a
    zero-stride stand-in of k in q's dtype and of its scales, q_scale's values where that is
    free (:func:`ditfuse.ops.attention_fp8.plan`)."""
    if q_scale is None:
        raise ValueError(
            f"q_scale is required with an 8-bit q ({q.dtype}): the fp32 (B, H, S_q) scales "
            "that ditfuse.qk_norm_rope(..., quantize=...) writes beside it"
        )
    if k.dim() != 4:
        want = "(B, S, H, D)" if opts["layout"] == "bshd" else "(B, H, S, D)"
        raise ValueError(f"k must be 4-D {want}, got {tuple(k.shape)}")
    kv = 1 if opts["layout"] == "bshd" else 2
    ks = _stand_in((k.shape[0], k.shape[3 - kv], k.shape[kv]), torch.float32, k.device)
    k8 = _stand_in(k.shape, q.dtype, k.device)
    p = fp8.plan(q, k8, v, q_scale=q_scale, k_scale=ks, check_scale_values=False, **opts)
    fp8._check_scale_values(p.q_scale, "q_scale")


def _quantize_k_like(k: Tensor, dtype: torch.dtype, layout: str):
    """16-bit k in the 8-bit ``dtype`` of its q, one scale a (batch, head, token): int8 by
    :func:`ditfuse.ops.attention_fp8.quantize_per_token`, e4m3 by the reference quantizer
    (:func:`ditfuse.reference.quantize_per_token`: the scheme of
    ``qk_norm_rope(..., quantize="fp8")``)."""
    if dtype == torch.int8:
        return _per_token_int8(k, layout)
    from ditfuse.reference import quantize_per_token as quantize_reference

    return quantize_reference(k, "fp8", layout=layout)
