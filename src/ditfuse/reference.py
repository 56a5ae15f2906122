"""Pure-PyTorch references of every ditfuse op, in one place.

They serve twice: as the oracle of the tests (run in float64, rounding only where the
kernel's contract says it rounds) and as the fallback on devices Triton cannot run on
(run in float32).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ditfuse.tolerances import ACT_EVAL, UNIT_ROUNDOFF


def _norm(x: torch.Tensor, n, act_dtype, cd) -> torch.Tensor:
    """x: (B, S, H, D) in the compute dtype ``cd``; ``n``: a resolved norm or None."""
    if n is None:
        return x
    B, S, H, D = x.shape
    xs = x.reshape(B, S, H * D) if n.span_all else x
    if n.code == 1:
        y = xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + n.eps)
    elif n.code == 2:
        mu = xs.mean(-1, keepdim=True)
        y = (xs - mu) * torch.rsqrt((xs - mu).pow(2).mean(-1, keepdim=True) + n.eps)
    elif n.code == 3:
        alpha = n.alpha_tensor.to(cd).reshape(()) if n.alpha_tensor is not None else n.alpha_value
        t = alpha * xs
        if n.round_pre_w:  # DynamicTanh in 16 bits: every op rounded
            t = t.to(act_dtype).to(cd)
        y = torch.tanh(t)
    else:  # pragma: no cover
        raise AssertionError(n.code)
    if n.round_pre_w:
        y = y.to(act_dtype).to(cd)
    shape = (H * D,) if n.span_all else (D,)
    if n.weight is not None:
        y = y * n.weight.reshape(shape).to(cd)
        if n.round_pre_w and n.bias is not None:  # diffusers: the product is a half tensor
            y = y.to(act_dtype).to(cd)
    if n.bias is not None:
        y = y + n.bias.reshape(shape).to(cd)
    return y.reshape(B, S, H, D)


def _pairs(x: torch.Tensor, R: int, interleaved: bool):
    xr = x[..., :R]
    if interleaved:
        return xr[..., 0::2], xr[..., 1::2]
    return xr[..., : R // 2], xr[..., R // 2 :]


def _unpair(a: torch.Tensor, b: torch.Tensor, interleaved: bool) -> torch.Tensor:
    if interleaved:
        return torch.stack((a, b), dim=-1).flatten(-2)
    return torch.cat((a, b), dim=-1)


def _rows(t: torch.Tensor, p) -> torch.Tensor:
    """(B, S, H, W) rows of a (B, rows, H, W) table view, gathered by positions."""
    B, S = p.q.shape[:2]
    if p.positions is None:
        return t
    idx = p.positions.long()
    return t[torch.arange(B, device=t.device)[:, None], idx]


def qk_norm_rope_core(p, compute_dtype=torch.float32):
    """Reference of :func:`ditfuse.qk_norm_rope` on a checked plan (see ``qk_norm_rope.plan``).

    Returns (q, k) as (B, S, H, D) tensors in the activation dtype.
    """
    cd = compute_dtype
    act = p.q.dtype
    R = p.rotary_dim
    outs = []
    for x, n in ((p.q, p.q_norm), (p.k, p.k_norm)):
        if x is None:
            outs.append(None)
            continue
        y = _norm(x.to(cd), n, act, cd)
        if p.round_after_norm:
            y = y.to(act).to(cd)
        if p.cos is not None:
            c = _rows(p.cos, p).to(cd)
            s = _rows(p.sin, p).to(cd)
            if p.table_half:
                ca = cb = c
                sa = sb = s
            else:
                ca, cb = _pairs(c, R, p.interleaved)
                sa, sb = _pairs(s, R, p.interleaved)
            ya, yb = _pairs(y, R, p.interleaved)
            rot = _unpair(ya * ca - yb * sa, yb * cb + ya * sb, p.interleaved)
            y = torch.cat((rot, y[..., R:]), dim=-1)
        outs.append(y.to(act))
    return outs[0], outs[1]


#: the largest magnitude of each 8-bit format a head's amax maps to
QUANT_MAX = {"int8": 127.0, "fp8": 448.0}
QUANT_DTYPES = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}


def quantize_per_token(y: torch.Tensor, fmt: str, *, layout: str = "bshd", num_heads=None):
    """8-bit values and fp32 scales of ``y``, one scale per (batch, head, token): the
    quantization of :func:`ditfuse.qk_norm_rope` with ``quantize=fmt`` (``"int8"`` or
    ``"fp8"``), applied to its 16-bit (or fp32) output ``y``.

    ``y``: ``(B, S, H, D)`` (``layout="bshd"``), ``(B, H, S, D)`` (``"bhsd"``) or
    ``(B, S, H*D)`` with ``num_heads``. For each head row ``y[b, s, h, :]``, in fp32::

        amax  = max_d |y[d]|                (NaN if a value is NaN)
        scale = amax / M,  inv = M / amax   (M = 127 int8, 448 fp8; both 1.0 where amax == 0;
                                             inv capped at the largest fp32)
        int8: clamp(round_half_to_even(y * inv), -127, 127)   (0 where that is NaN)
        fp8:  (y * inv).to(torch.float8_e4m3fn)          (round to nearest even)

    A head row holding a NaN gets a NaN scale (an infinity: an infinite scale), so that
    attention on the 8-bit values is NaN where softmax attention on ``y`` is.

    Returns ``(values, scales)``: values in ``y``'s shape (contiguous, torch.int8 or
    torch.float8_e4m3fn), scales ``(B, H, S)`` float32 (contiguous).
    """
    if fmt not in QUANT_MAX:
        raise ValueError(f"fmt must be one of {tuple(QUANT_MAX)}, got {fmt!r}")
    if y.dim() == 3:
        y4 = y.unflatten(2, (num_heads, y.shape[2] // num_heads))
    else:
        y4 = y if layout == "bshd" else y.transpose(1, 2)
    yf = y4.float()
    amax = yf.abs().amax(-1, keepdim=True)
    # tensor / tensor: PyTorch evaluates a Python number over a tensor as a multiply by the
    # reciprocal (two roundings); the kernel divides once, correctly rounded
    M = torch.full_like(amax, QUANT_MAX[fmt])
    one = torch.ones_like(amax)
    scale = torch.where(amax == 0, one, amax / M)
    inv = torch.where(amax == 0, one, (M / amax).clamp(max=torch.finfo(torch.float32).max))
    t = yf * inv
    if fmt == "int8":
        r = torch.round(t).clamp(-127, 127)
        v = torch.where(r == r, r, torch.zeros_like(r)).to(torch.int8)
    else:
        v = t.to(torch.float8_e4m3fn)
    if y.dim() == 3:
        v = v.flatten(2)
    elif layout != "bshd":
        v = v.transpose(1, 2)
    return v.contiguous(), scale[..., 0].transpose(1, 2).contiguous()


# --------------------------------------------------------------------------------------
# AdaLN modulation and the gated residual (ditfuse.ops.adaln)


def _adaln_norm(x, norm, weight, bias, eps, cd):
    if norm == "layer":
        mu = x.mean(-1, keepdim=True)
        y = (x - mu) * torch.rsqrt((x - mu).pow(2).mean(-1, keepdim=True) + eps)
    elif norm == "rms":
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    else:
        y = x
    if weight is not None:
        y = y * weight.to(cd)
    if bias is not None:
        y = y + bias.to(cd)
    return y


class AdaLNOptions(NamedTuple):
    """The keyword arguments of :func:`ditfuse.adaln_modulate` that describe the
    computation, with their public defaults: what :func:`adaln_reference` takes as
    ``**options``, and ``ditfuse.ops.adaln``'s plan and launches as one value."""

    norm: str | None = "layer"
    weight: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    eps: float = 1e-6
    rounding: str = "once"


def adaln_reference(
    x, shift=None, scale=None, *, residual=None, gate=None, compute_dtype=torch.float32, **options
):
    """Reference of :func:`ditfuse.adaln_modulate` and, with ``residual`` given, of
    :func:`ditfuse.gated_residual_adaln` (returns ``(x_new, modulated)`` then).
    ``options``: the fields of :class:`AdaLNOptions`.

    ``rounding="once"``: fp32 (here ``compute_dtype``) math, rounded to x's dtype at each
    stored result. ``"per_op"``: every elementwise step rounded to x's dtype, as a
    half-precision eager chain does.

    Shapes as the op reads them: x (B, S, D) or (B, D); shift / scale / gate (D,), (1|B, D)
    (one row per batch entry, not per token), (1|B, 1, D) or (1|B, S, D).
    """
    norm, weight, bias, eps, rounding = AdaLNOptions(**options)
    cd = compute_dtype
    act = x.dtype
    shape = x.shape

    def rows(t):  # (B, S, D) view: a 2-D operand is one row per batch entry
        if t is None:
            return None
        return t[None, None] if t.dim() == 1 else t[:, None] if t.dim() == 2 else t

    def r(t):
        return t.to(act).to(cd) if rounding == "per_op" else t

    xs = rows(x).to(cd)
    shift, scale, gate = rows(shift), rows(scale), rows(gate)
    x_new = None
    if residual is not None:
        y = rows(residual).to(cd)
        p = r(y * gate.to(cd)) if gate is not None else y
        xs = (xs + p).to(act).to(cd)  # the new residual stream is stored, then normalised
        x_new = xs.to(act).reshape(shape)
    n = _adaln_norm(xs, norm, weight, bias, eps, cd) if norm else xs
    n = r(n)
    if scale is not None:
        n = r(n * r(1 + scale.to(cd)))
    if shift is not None:
        n = r(n + shift.to(cd))
    out = n.to(act).reshape(shape)
    return (x_new, out) if residual is not None else out


# --------------------------------------------------------------------------------------
# GroupNorm + SiLU and Wan's channel RMS norm + SiLU (ditfuse.ops.group_norm)


def _channel_shape(p, x):
    """A per-channel parameter (C elements, any (C,)/(C, 1, 1)-like shape) broadcast to x."""
    return p.reshape((1, x.shape[1]) + (1,) * (x.dim() - 2))


def _silu_ref(y):
    return y / (1 + torch.exp(-y))


class RoundedChain(NamedTuple):
    """A reference result with what the numerical contract needs to know about its chain.

    The GroupNorm / channel-RMS chains round to x's dtype between steps (``round_after_norm``),
    as the models' eager code does; a rounding *before* the last one is an intermediate
    rounding. ``steps`` lists one ``(t, gain)`` per intermediate rounding: ``t`` the rounded
    value (compute dtype, x's shape), ``gain`` a bound of ``|d v / d t|`` (a tensor that
    broadcasts to x, or a float), ``v`` the value entering the last stage: the SiLU's input
    ``silu_in`` (compute dtype; ``None`` without a SiLU), or the value the output rounds.
    ``stats``: GroupNorm's per-group ``mean`` and ``rstd`` (compute dtype, broadcast shape
    ``(N, C, 1, ...)``); empty for the channel RMS norm.
    """

    out: torch.Tensor
    steps: list
    silu_in: torch.Tensor | None
    stats: dict


class GNOptions(NamedTuple):
    """The arguments of :func:`ditfuse.group_norm_silu` after ``num_groups`` (``out``
    aside), with their public defaults: what :func:`group_norm_silu_chain` takes."""

    weight: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    eps: float = 1e-6
    silu: bool = True
    round_after_norm: bool = True


class RMSOptions(NamedTuple):
    """The arguments of :func:`ditfuse.rms_norm_silu_channels` after x (``out`` aside), with
    their public defaults: what :func:`rms_norm_silu_channels_chain` takes."""

    gamma: torch.Tensor | None = None
    bias: torch.Tensor | float | None = None
    eps: float = 1e-12
    scale: float | None = None
    silu: bool = True
    round_after_norm: bool = True


def group_norm_silu_chain(
    x, num_groups, *args, compute_dtype=torch.float64, record=True, **kwargs
) -> RoundedChain:
    """:func:`group_norm_silu_reference` with its intermediate rounding exposed (see
    :class:`RoundedChain`): with ``round_after_norm`` and ``silu`` the normalised, affine
    value ``y`` is rounded to x's dtype before the SiLU (gain 1); without SiLU that rounding
    is the output's own. ``args``, ``kwargs``: the fields of :class:`GNOptions`.
    ``record=False``: the output only (no steps, stats, silu_in)."""
    weight, bias, eps, silu, round_after_norm = GNOptions(*args, **kwargs)
    cd = compute_dtype
    N, C = x.shape[:2]
    xs = x.to(cd).reshape(N, num_groups, -1)
    mu = xs.mean(-1, keepdim=True)
    var = (xs - mu).pow(2).mean(-1, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    y = ((xs - mu) * rstd).reshape(x.shape)
    if weight is not None:
        y = y * _channel_shape(weight, x).to(cd)
    if bias is not None:
        y = y + _channel_shape(bias, x).to(cd)
    if round_after_norm:
        y = y.to(x.dtype).to(cd)
    steps = [(y, 1.0)] if (round_after_norm and silu and record) else []
    pre = y if (silu and record) else None
    if silu:
        y = _silu_ref(y)
    if not record:
        return RoundedChain(y.to(x.dtype), [], None, {})
    bshape = (N, C) + (1,) * (x.dim() - 2)

    def per_channel(t):  # (N, G, 1) -> (N, C, 1, ...)
        return t.expand(N, num_groups, C // num_groups).reshape(bshape)

    return RoundedChain(
        y.to(x.dtype), steps, pre, {"mean": per_channel(mu), "rstd": per_channel(rstd)}
    )


def group_norm_silu_reference(x, num_groups, *args, compute_dtype=torch.float32, **kwargs):
    """Pure-PyTorch :func:`ditfuse.group_norm_silu` (same arguments, those of
    :func:`group_norm_silu_chain`; no ``out``; does not validate them): the chain's output.
    x: (N, C, *spatial); statistics two-pass in ``compute_dtype``; one rounding to x's dtype
    at the end (and after the affine with ``round_after_norm``)."""
    return group_norm_silu_chain(
        x, num_groups, *args, compute_dtype=compute_dtype, record=False, **kwargs
    ).out


def rms_norm_silu_channels_chain(
    x, *args, compute_dtype=torch.float64, record=True, **kwargs
) -> RoundedChain:
    """:func:`rms_norm_silu_channels_reference` with its intermediate roundings exposed (see
    :class:`RoundedChain`). With ``round_after_norm`` each step rounds: ``r1`` = normalize,
    ``r2 = r1 * scale``, ``r3 = r2 * gamma``, ``r4 = r3 + bias``; a change of ``r1`` reaches
    the last value times ``scale * |gamma|``, of ``r2`` times ``|gamma|``, of ``r3`` and
    ``r4`` times 1. Without SiLU the last of them is the output's own rounding. ``args``,
    ``kwargs``: the fields of :class:`RMSOptions`. ``record=False``: the output only."""
    gamma, bias, eps, scale, silu, round_after_norm = RMSOptions(*args, **kwargs)
    cd = compute_dtype
    act = x.dtype
    C = x.shape[1]
    if scale is None:
        scale = C**0.5
    if isinstance(bias, (int, float)) and bias == 0:
        bias = None
    g = None if gamma is None else _channel_shape(gamma, x).to(cd)
    rounded = []  # (value after a rounding, gain of that value to the last value)

    def r(t, gain):
        if round_after_norm:
            t = t.to(act).to(cd)
            if record:
                rounded.append((t, gain))
        return t

    xs = x.to(cd)
    ga = 1.0 if g is None else g.abs()
    y = r(xs / xs.pow(2).sum(1, keepdim=True).sqrt().clamp_min(eps), abs(scale) * ga)
    y = r(y * scale, ga)
    if g is not None:
        y = r(y * g, 1.0)
    if bias is not None:
        y = r(y + _channel_shape(bias, x).to(cd), 1.0)
    pre = y
    if silu:
        y = _silu_ref(y)
    steps = rounded if silu else rounded[:-1]
    return RoundedChain(y.to(act), steps, pre if (silu and record) else None, {})


def rms_norm_silu_channels_reference(x, *args, compute_dtype=torch.float32, **kwargs):
    """Pure-PyTorch :func:`ditfuse.rms_norm_silu_channels` (the arguments of
    :func:`rms_norm_silu_channels_chain`): diffusers' ``WanRMS_norm``
    (``F.normalize(x, dim=1) * sqrt(C) * gamma + bias``) then SiLU, in ``compute_dtype``.
    ``round_after_norm`` rounds to x's dtype after each step, as the eager chain in half
    precision does. Does not validate its arguments."""
    return rms_norm_silu_channels_chain(
        x, *args, compute_dtype=compute_dtype, record=False, **kwargs
    ).out


# --------------------------------------------------------------------------------------
# MLP activations (ditfuse.ops.activations)


def swiglu_reference(x, *, compute_dtype=torch.float32):
    """Pure-PyTorch :func:`ditfuse.swiglu` (no ``out``; does not validate): Flux2SwiGLU's two
    eager ops, ``a = silu(x1)`` then ``a * x2``, each computed in ``compute_dtype`` and
    rounded to x's dtype."""
    cd = compute_dtype
    H = x.shape[-1] // 2
    a = _silu_ref(x[..., :H].to(cd)).to(x.dtype).to(cd)
    return (a * x[..., H:].to(cd)).to(x.dtype)


def gelu_reference(x, approximate="tanh", *, compute_dtype=torch.float32, round_output=True):
    """Pure-PyTorch :func:`ditfuse.gelu`: PyTorch's formula in ``compute_dtype``, one
    rounding to x's dtype."""
    xs = x.to(compute_dtype)
    if approximate == "tanh":
        inner = (2 / torch.pi) ** 0.5 * (xs + 0.044715 * (xs * xs * xs))  # torch's order
        y = 0.5 * xs * (1 + torch.tanh(inner))
    else:
        y = xs * 0.5 * (1 + torch.erf(xs * 0.5**0.5))
    return y.to(x.dtype) if round_output else y


# "one rounding" of v: |error| <= u |v| + tiny (``UNIT_ROUNDOFF``); the activations' fp32
# evaluation error ``ACT_EVAL``: both in ditfuse.tolerances


def swiglu_bound(x):
    """(fp64 ``silu(x1) * x2``, the contract's bound on |y - it|): two eager ops, each
    rounded once to x's dtype, plus the fp32 evaluation of silu."""
    u, tiny = UNIT_ROUNDOFF[x.dtype]
    H = x.shape[-1] // 2
    x1, x2 = x[..., :H].double(), x[..., H:].double()
    exact = x1 / (1 + torch.exp(-x1)) * x2
    return exact, (2 * u + u * u + ACT_EVAL) * exact.abs() + tiny * (x2.abs() * (1 + u) + 1)


def gelu_bound(x, approximate="tanh", loose=1.0):
    """(fp64 GELU, the contract's bound on |y - it|): one rounding to x's dtype plus
    ``loose`` times the fp32 evaluation error (``ACT_EVAL`` of |x| + |y|)."""
    u, tiny = UNIT_ROUNDOFF[x.dtype]
    exact = gelu_reference(x, approximate, compute_dtype=torch.float64, round_output=False)
    return exact, u * exact.abs() + tiny + loose * ACT_EVAL * (x.double().abs() + exact.abs())


# --------------------------------------------------------------------------------------
# Sliding-window (and differential) attention (ditfuse.sliding_window_attention)


def band_keep(n: int, left: int, right: int, device=None) -> torch.Tensor:
    """(n, n) bool mask: query i keeps key j iff i - left <= j <= i + right (-1: unbounded).

    ``band_keep(n, w, w)`` is SAME's ``_band_mask(n, w)`` (``|j - i| <= w``) as booleans.
    """
    idx = torch.arange(n, device=device)
    delta = idx[None, :] - idx[:, None]  # j - i
    keep = torch.ones(n, n, dtype=torch.bool, device=device)
    if left >= 0:
        keep &= delta >= -left
    if right >= 0:
        keep &= delta <= right
    return keep


def _masked_attention(q, k, v, bias, scale, cd):
    """softmax(q k^T * scale + bias) v per (batch, head); (B, N, H, D) in, compute dtype
    ``cd`` out. Heads go in groups so the (N, N) scores stay below ~2^28 elements."""
    B, N, H, D = q.shape
    out = torch.empty(B, N, H, D, dtype=cd, device=q.device)
    hc = max(1, (1 << 28) // max(1, B * N * N))
    for h0 in range(0, H, hc):
        h1 = min(H, h0 + hc)
        qs, ks, vs = (t[:, :, h0:h1].to(cd).transpose(1, 2) for t in (q, k, v))
        s = (qs @ ks.transpose(-1, -2)) * scale + bias
        out[:, :, h0:h1] = (torch.softmax(s, dim=-1) @ vs).transpose(1, 2)
        del s
    return out


def sliding_window_attention_core(p, compute_dtype=torch.float32):
    """Reference of :func:`ditfuse.sliding_window_attention` on a checked plan
    (``attention.plan``): the dense-mask formula. Returns (B, N, H, D) in the input dtype.

    The prologue (norm, RoPE) is ``qk_norm_rope``'s reference, rounded to the activation
    dtype where the kernel rounds; the attention itself is exact in ``compute_dtype``
    (float64 for the tests: no tf32, no rounding of the probabilities).
    """
    import dataclasses

    cd = compute_dtype
    act = p.q.dtype
    q, k, q2, k2 = p.q, p.k, p.q2, p.k2
    if p.qk is not None:
        q, k = qk_norm_rope_core(p.qk, cd)
        if q2 is not None:
            q2, k2 = qk_norm_rope_core(dataclasses.replace(p.qk, q=p.q2, k=p.k2), cd)
    B, N, H, D = p.q.shape
    keep = band_keep(N, p.left, p.right, p.q.device)
    bias = torch.zeros(N, N, dtype=cd, device=p.q.device).masked_fill(~keep, float("-inf"))
    out = _masked_attention(q, k, p.v, bias, p.scale, cd)
    if q2 is not None:
        lam = p.lam_value if p.lam_tensor is None else p.lam_tensor.to(cd).reshape(1, 1, H, 1)
        out = out - lam * _masked_attention(q2, k2, p.v, bias, p.scale, cd)
    return out.to(act)


def quantize_v_e4m3(v: torch.Tensor):
    """V ``(B, S, H, D)`` as the 8-bit attention quantizes it: ``(v8, scale)`` with
    ``scale[b, h, d] = amax_s |v| / 448`` (1 for a zero channel, NaN for a channel holding a
    NaN, fp32) and ``v8 = e4m3(v * (448 / amax))`` (1 for a zero channel; the division once a
    channel, capped at the largest fp32) in V's shape."""
    x = v.float()
    amax = x.abs().amax(dim=1)  # (B, H, D), NaN propagates
    one = torch.ones_like(amax)
    M = torch.full_like(amax, 448.0)  # tensor / tensor: one rounding, as the kernel's division
    scale = torch.where(amax == 0, one, amax / M)
    inv = torch.where(amax == 0, one, (M / amax).clamp(max=torch.finfo(torch.float32).max))
    return (x * inv[:, None]).to(torch.float8_e4m3fn), scale


def attention_8bit_core(
    q8, k8, v, q_scale, k_scale, *, scale, left=-1, right=-1, key_mask=None, chunk=1024
):
    """8-bit attention emulated in PyTorch (fp32): the operands dequantized exactly as the
    kernel's (``q = q8 * q_scale``, V through :func:`quantize_v_e4m3`), the scores and the
    softmax in fp32, P times 256 rounded to e4m3, ``out = (P8 @ V8) / l8 * v_scale`` with
    ``l8`` the row sum of the rounded P8 (the output a convex combination of V's quantized
    rows). NaN in an operand propagates as in softmax attention (NaN scores: the row; a NaN
    scale of V: its channel); masked scores are -inf after the scales multiply. q8 / k8 / v
    ``(B, S, H, D)``, scales ``(B, H, S)``, ``key_mask`` bool ``(B, S_kv)`` (keys kept); the
    output ``(B, S_q, H, D)`` in v's dtype (zeros in a row with no key), queries ``chunk`` at
    a time."""
    B, S_q, H, D = q8.shape
    S_kv = k8.shape[1]
    qf = q8.float().transpose(1, 2) * q_scale[..., None]  # (B, H, S_q, D)
    kf = k8.float().transpose(1, 2) * k_scale[..., None]
    v8, vs = quantize_v_e4m3(v)
    vf = v8.float().transpose(1, 2)  # (B, H, S_kv, D)
    out = torch.empty(B, H, S_q, D, dtype=torch.float32, device=q8.device)
    j = torch.arange(S_kv, device=q8.device)
    for i0 in range(0, S_q, chunk):
        s = (qf[:, :, i0 : i0 + chunk] @ kf.transpose(-1, -2)) * scale
        if left >= 0 or right >= 0:
            i = torch.arange(i0, min(i0 + chunk, S_q), device=q8.device)[:, None]
            keep = torch.ones(i.shape[0], S_kv, dtype=torch.bool, device=q8.device)
            if left >= 0:
                keep &= j[None, :] >= i - left
            if right >= 0:
                keep &= j[None, :] <= i + right
            s = s.masked_fill(~keep, float("-inf"))
        if key_mask is not None:
            s = s.masked_fill(~key_mask[:, None, None, :], float("-inf"))
        m = s.amax(dim=-1, keepdim=True)
        p = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
        p8 = (p * 256.0).to(torch.float8_e4m3fn).float()
        l8 = p8.sum(-1, keepdim=True)
        out[:, :, i0 : i0 + chunk] = (p8 @ vf) / torch.where(l8 > 0, l8, torch.ones_like(l8))
    out = out * vs[:, :, None, :]
    return out.transpose(1, 2).to(v.dtype)


def quantize_rows_fp8_reference(x2: torch.Tensor, activation=None):
    """(M, K) -> (e4m3 (M, K), fp32 (M,)): each row scaled by ``448 / amax`` and rounded to
    nearest even; ``scale = amax / 448`` (an all-zero row: 1; a row with a NaN or an
    infinity: NaN, and zeros); ``activation="gelu_tanh"``: of :func:`gelu_reference` of the
    rows. The contract of :func:`ditfuse.ops.linear_fp8.quantize_rows`, bitwise."""
    if activation == "gelu_tanh":
        x2 = gelu_reference(x2, "tanh")
    xf = x2.float()
    return _e4m3_scaled(xf, xf.abs().amax(dim=1), ~torch.isfinite(xf).all(dim=1))


def _e4m3_scaled(x: torch.Tensor, amax: torch.Tensor, bad: torch.Tensor):
    """fp32 ``x`` as e4m3 with one scale for each index of ``amax`` (x's leading dims; ``bad``
    beside it): ``q = e4m3_rne(x * (448 / amax))`` (saturating), ``scale = amax / 448``, both
    divisions correctly rounded; amax 0: scale 1; ``bad`` (a NaN or an infinity): scale NaN
    and zeros."""
    one = torch.ones_like(amax)
    zero = (amax == 0) & ~bad
    safe = torch.where(zero | bad, one, amax)
    e4m3_max = torch.full_like(amax, 448.0)  # tensor / tensor: `448.0 / t` is a reciprocal
    inv = torch.where(zero, one, e4m3_max / safe)  # times 448, not div.rn
    nan = torch.full_like(amax, float("nan"))
    scale = torch.where(bad, nan, torch.where(zero, one, safe / e4m3_max))
    each = amax.shape + (1,) * (x.dim() - amax.dim())
    y = (x * inv.view(each)).clamp(-448.0, 448.0)
    return torch.where(bad.view(each), torch.zeros_like(y), y).to(torch.float8_e4m3fn), scale


def attention_out_rows8(o: torch.Tensor, v: torch.Tensor, key_mask=None):
    """A 16-bit attention output ``o`` (B, S_q, H, D) as e4m3 rows for an FP8 linear, with
    one scale a batch entry from the values ``v`` (B, S_kv, H, D) it attended (``key_mask``
    (B, S_kv) bool: the keys kept): ``amax`` = the largest |v| of the entry's attended keys
    over every head and channel, which bounds every output of softmax attention (a convex
    combination of V's rows); ``q = e4m3_rne(o * (448 / amax))`` (saturating),
    ``scale = amax / 448`` for each token (both divisions correctly rounded); amax 0: scale
    1; a NaN or an infinity among those values: scale NaN and zeros. The contract of
    ``ditfuse.attention(..., quantize_out="fp8")``, bitwise: (e4m3 (B, S_q, H, D),
    fp32 (B, S_q))."""
    a = v.abs()
    if key_mask is not None:
        a = torch.where(key_mask[:, :, None, None], a, torch.zeros_like(a))
    amax = a.amax(dim=(1, 2, 3)).float()  # NaN propagates
    q, scale = _e4m3_scaled(o.float(), amax, ~torch.isfinite(amax))
    return q, scale[:, None].expand(o.shape[:2]).contiguous()


def gemm_fp8_rows_reference(q, q_scale, w_q, w_scale, bias=None) -> torch.Tensor:
    """The FP8 GEMM's contract in fp64 (:func:`ditfuse.ops.gemm_fp8.gemm_fp8_rows`): the e4m3
    products summed exactly, scaled by ``q_scale[:, None] * w_scale[None, :]``, plus the bias;
    (M, N) float64, before the GEMM's accumulator precision and final rounding."""
    y = (q.double() @ w_q.double().t()) * q_scale.double()[:, None] * w_scale.double()[None, :]
    return y if bias is None else y + bias.double()


def linear_fp8_reference(x: torch.Tensor, w: torch.Tensor, bias=None) -> torch.Tensor:
    """The FP8 linear in fp64 from the quantized operands (activations a row, the weight an
    output channel): what :func:`ditfuse.ops.linear_fp8.linear_fp8` computes up to its GEMM's
    accumulator precision and final rounding."""
    qx, sx = quantize_rows_fp8_reference(x.reshape(-1, x.shape[-1]))
    qw, sw = quantize_rows_fp8_reference(w)
    return gemm_fp8_rows_reference(qx, sx, qw, sw, bias).view(*x.shape[:-1], w.shape[0])
