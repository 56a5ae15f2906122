"""Norm descriptions: ditfuse's own :class:`NormSpec`, and reading one off a model's module.

A fused kernel needs the numbers of a norm (kind, weight, bias, eps, DyT's alpha), not the
module. :func:`resolve_norm` accepts the modules the target models use and turns them into
a :class:`NormSpec`; users without those modules build a ``NormSpec`` directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import torch

NORM_KINDS = ("rms", "layer", "dyt")
#: The kernels' norm kind (their ``NORM`` constexpr; ``ditfuse.kernels.common`` names them
#: for the kernels) and the ``torch.library`` schemas' ``*_kind`` argument.
NO_NORM, RMS, LAYER, DYT = 0, 1, 2, 3
KIND_CODE = {"rms": RMS, "layer": LAYER, "dyt": DYT}
_KIND_NAME = {code: name for name, code in KIND_CODE.items()}


@dataclass(frozen=True)
class NormSpec:
    """A normalisation applied over the last ``size`` channels of each token or head.

    kind:
        ``"rms"``: ``x * rsqrt(mean(x^2) + eps) * weight + bias``;
        ``"layer"``: ``(x - mean) * rsqrt(var + eps) * weight + bias``;
        ``"dyt"``: ``tanh(alpha * x) * weight + bias`` (Dynamic Tanh, no reduction).
    size:
        the number of channels one statistic spans: ``head_dim`` (per head) or
        ``num_heads * head_dim`` (across all heads of a token, Wan's
        ``rms_norm_across_heads``). ``None``: taken from ``weight.numel()``, else per head.
    eps:
        ``None`` means ``torch.finfo(torch.float32).eps``, as ``torch.nn.RMSNorm(eps=None)``
        computes in fp32 and takes that type's epsilon for every activation dtype.
    alpha:
        DyT's scale: a float or a one-element tensor (read on the device, no sync).
    round_before_weight:
        round the normalised value to the activation dtype before the weight multiply (and
        the product before the bias), as diffusers' ``RMSNorm`` does when its weight is
        fp16/bf16; for ``"dyt"`` also ``alpha * x`` before the tanh, as SAME's
        ``DynamicTanh`` computes with 16-bit parameters (every op rounded).
    """

    kind: str
    weight: Optional[torch.Tensor] = None
    bias: Optional[torch.Tensor] = None
    eps: Optional[float] = 1e-6
    alpha: Union[float, torch.Tensor, None] = None
    size: Optional[int] = None
    round_before_weight: bool = False

    def __post_init__(self):
        if self.kind not in NORM_KINDS:
            raise ValueError(f"NormSpec.kind must be one of {NORM_KINDS}, got {self.kind!r}")
        if self.kind == "dyt" and self.alpha is None:
            raise ValueError("NormSpec(kind='dyt') needs alpha (a float or a one-element tensor)")
        if self.kind != "dyt" and self.alpha is not None:
            raise ValueError(f"NormSpec.alpha is only used by kind='dyt', not {self.kind!r}")
        if self.eps is not None and not (self.eps >= 0 and math.isfinite(self.eps)):
            raise ValueError(f"NormSpec.eps must be a finite number >= 0, got {self.eps!r}")

    @property
    def code(self) -> int:
        """The kernels' kind: ``RMS``, ``LAYER`` or ``DYT``."""
        return KIND_CODE[self.kind]

    def span(self) -> Optional[int]:
        if self.size is not None:
            return int(self.size)
        if self.weight is not None:
            return int(self.weight.numel())
        if self.bias is not None:
            return int(self.bias.numel())
        return None


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _kind(norm) -> Optional[str]:
    """Which recognised norm ``norm`` is, or None (the one place that recognises them)."""
    if norm is None or isinstance(norm, torch.nn.Identity):
        return "none"
    if isinstance(norm, NormSpec):
        return "spec"
    if isinstance(norm, torch.nn.RMSNorm):
        return "rms"
    if isinstance(norm, torch.nn.LayerNorm):
        return "layer"
    name = type(norm).__name__
    if name == "DynamicTanh" and hasattr(norm, "alpha") and hasattr(norm, "gamma"):
        return "dyt"
    if name == "StableAudio3RMSNorm" and hasattr(norm, "gamma"):
        return "sa3" if getattr(norm, "force_fp32", True) else "sa3-half"
    if name == "RMSNorm" and hasattr(norm, "eps") and hasattr(norm, "dim"):
        return "diffusers-rms"
    return None


def norm_readable(norm) -> bool:
    """Whether :func:`resolve_norm` accepts ``norm`` (no exception, no NormSpec built:
    cheap enough for a processor to ask on every call, and traceable by torch.compile)."""
    return _kind(norm) not in (None, "sa3-half")


def resolve_norm(norm, arg: str) -> Optional[NormSpec]:
    """Turn ``norm`` (a module, a :class:`NormSpec` or ``None``) into a ``NormSpec``.

    Recognised modules: ``torch.nn.RMSNorm``, ``torch.nn.LayerNorm`` (and subclasses such
    as diffusers' ``FP32LayerNorm``), diffusers' ``RMSNorm``, ``StableAudio3RMSNorm``,
    SAME's ``DynamicTanh``, and ``torch.nn.Identity`` (no norm).
    """
    kind = _kind(norm)
    if kind == "none":
        return None
    if kind == "spec":
        return norm
    if kind == "rms":
        return NormSpec("rms", weight=norm.weight, eps=norm.eps, size=_numel(norm.normalized_shape))
    if kind == "layer":
        return NormSpec(
            "layer",
            weight=norm.weight,
            bias=norm.bias,
            eps=norm.eps,
            size=_numel(norm.normalized_shape),
        )
    if kind == "dyt":
        # 16-bit parameters: the module computes in the activation dtype, one op at a time
        # (alpha * x, tanh, * gamma, + beta each rounded), which round_before_weight follows
        return NormSpec(
            "dyt",
            weight=norm.gamma,
            bias=getattr(norm, "beta", None),
            eps=None,
            alpha=norm.alpha,
            size=norm.gamma.numel(),
            round_before_weight=norm.gamma.dtype in (torch.float16, torch.bfloat16),
        )
    if kind == "sa3-half":
        raise TypeError(
            f"{arg}: StableAudio3RMSNorm(force_fp32=False) computes in the activation "
            "dtype; ditfuse computes in fp32 only"
        )
    if kind == "sa3":
        return NormSpec("rms", weight=norm.gamma, eps=norm.eps, size=norm.gamma.numel())
    if kind == "diffusers-rms":
        w = getattr(norm, "weight", None)
        return NormSpec(
            "rms",
            weight=w,
            bias=getattr(norm, "bias", None),
            eps=norm.eps,
            size=_numel(norm.dim),
            round_before_weight=w is not None and w.dtype in (torch.float16, torch.bfloat16),
        )
    name = type(norm).__name__
    raise TypeError(
        f"{arg}: cannot read a norm from {type(norm).__module__}.{name}; pass torch.nn.RMSNorm, "
        "torch.nn.LayerNorm, diffusers RMSNorm/FP32LayerNorm, StableAudio3RMSNorm, DynamicTanh, "
        "a ditfuse.NormSpec, or None"
    )


def needs_grad(t) -> bool:
    """Whether autograd would need a backward through ``t``: a tensor that requires grad, a
    module with such a parameter, or a :class:`NormSpec` holding such a tensor. ``None``
    (an absent input) needs nothing. The ops' inference-only checks (with grad enabled)."""
    if isinstance(t, torch.nn.Module):
        return any(p.requires_grad for p in t.parameters())
    if isinstance(t, NormSpec):
        return any(
            isinstance(v, torch.Tensor) and v.requires_grad for v in (t.weight, t.bias, t.alpha)
        )
    return isinstance(t, torch.Tensor) and t.requires_grad


def check_affine(p, name: str, n: int, x: torch.Tensor, x_name: str, n_text=None) -> None:
    """A norm's weight or bias ``p`` as the kernels read it, or a TypeError / ValueError
    naming ``name``: a floating-point tensor of ``n`` elements (``n_text``: how the message
    names that count), on the device of the activations ``x`` (``x_name``), contiguous."""
    if not isinstance(p, torch.Tensor) or not p.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor")
    if p.numel() != n:
        raise ValueError(f"{name} has {p.numel()} elements; expected {n_text or n}")
    if p.device != x.device:
        raise ValueError(f"{name} is on {p.device}, {x_name} is on {x.device}")
    if not p.is_contiguous():
        raise ValueError(f"{name} must be contiguous (ditfuse makes no hidden copy)")


# a norm as plain op arguments (torch.library schemas take tensors and scalars, not objects)


def flatten_norm(norm, arg):
    """A norm as op arguments: (weight, bias, alpha tensor, kind, eps, size, alpha, pre)."""
    spec = resolve_norm(norm, arg)
    if spec is None:
        return None, None, None, NO_NORM, -1.0, 0, 0.0, False
    a_t = spec.alpha if isinstance(spec.alpha, torch.Tensor) else None
    a_v = float(spec.alpha) if (spec.alpha is not None and a_t is None) else 0.0
    return (
        spec.weight,
        spec.bias,
        a_t,
        spec.code,
        -1.0 if spec.eps is None else float(spec.eps),
        int(spec.size or 0),
        a_v,
        bool(spec.round_before_weight),
    )


def unflatten_norm(w, b, a_t, kind, eps, size, a_v, pre):
    if kind == NO_NORM:
        return None
    alpha = a_t if a_t is not None else (a_v if kind == DYT else None)
    return NormSpec(
        _KIND_NAME[kind],
        weight=w,
        bias=b,
        eps=None if eps < 0 else eps,
        alpha=alpha,
        size=size or None,
        round_before_weight=pre,
    )
