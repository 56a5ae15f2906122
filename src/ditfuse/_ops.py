"""``torch.library`` registration of the ops, so ``torch.compile(fullgraph=True)`` and
CUDA-graph capture see them as single opaque nodes with fake (meta) implementations.

Eager calls of the public functions skip the dispatcher and launch directly; only code
being compiled goes through these ops.
"""
from __future__ import annotations

from typing import List, Optional

import torch
from torch import Tensor

from . import _library
from .norms import NormSpec, resolve_norm
from .qk_norm_rope import call as _call, plan as _plan

_KINDS = {0: None, 1: "rms", 2: "layer", 3: "dyt"}


def _flatten_norm(norm, arg):
    """A norm as op arguments: (weight, bias, alpha tensor, kind, eps, size, alpha, pre)."""
    spec = resolve_norm(norm, arg)
    if spec is None:
        return None, None, None, 0, -1.0, 0, 0.0, False
    a_t = spec.alpha if isinstance(spec.alpha, Tensor) else None
    a_v = float(spec.alpha) if (spec.alpha is not None and a_t is None) else 0.0
    return (spec.weight, spec.bias, a_t, spec.code, -1.0 if spec.eps is None else float(spec.eps),
            int(spec.size or 0), a_v, bool(spec.round_before_weight))


def _unflatten_norm(w, b, a_t, kind, eps, size, a_v, pre):
    if kind == 0:
        return None
    alpha = a_t if a_t is not None else (a_v if kind == 3 else None)
    return NormSpec(_KINDS[kind], weight=w, bias=b, eps=None if eps < 0 else eps, alpha=alpha,
                    size=size or None, round_before_weight=pre)


def _kwargs(positions, qn, kn, num_heads, rope_style, rotary_dim, round_after_norm, layout):
    return dict(q_norm=_unflatten_norm(*qn), k_norm=_unflatten_norm(*kn),
                num_heads=num_heads or None, rope_style=rope_style,
                rotary_dim=rotary_dim or None, positions=positions,
                round_after_norm=round_after_norm, layout=layout)


@_library.op("ditfuse::qk_norm_rope", mutates_args=())
def qk_norm_rope_op(
    q: Tensor, k: Optional[Tensor], cos: Optional[Tensor], sin: Optional[Tensor],
    positions: Optional[Tensor],
    q_weight: Optional[Tensor], q_bias: Optional[Tensor], q_alpha_t: Optional[Tensor],
    q_kind: int, q_eps: float, q_size: int, q_alpha: float, q_pre: bool,
    k_weight: Optional[Tensor], k_bias: Optional[Tensor], k_alpha_t: Optional[Tensor],
    k_kind: int, k_eps: float, k_size: int, k_alpha: float, k_pre: bool,
    num_heads: int, rope_style: str, rotary_dim: int, round_after_norm: bool, layout: str,
) -> List[Tensor]:
    kw = _kwargs(positions, (q_weight, q_bias, q_alpha_t, q_kind, q_eps, q_size, q_alpha, q_pre),
                 (k_weight, k_bias, k_alpha_t, k_kind, k_eps, k_size, k_alpha, k_pre),
                 num_heads, rope_style, rotary_dim, round_after_norm, layout)
    qo, ko = _call(q, k, cos, sin, inplace=False, **kw)
    return [qo] if ko is None else [qo, ko]


@qk_norm_rope_op.register_fake
def _(q, k, cos, sin, positions, q_weight, q_bias, q_alpha_t, q_kind, q_eps, q_size, q_alpha,
      q_pre, k_weight, k_bias, k_alpha_t, k_kind, k_eps, k_size, k_alpha, k_pre, num_heads,
      rope_style, rotary_dim, round_after_norm, layout):
    kw = _kwargs(positions, (q_weight, q_bias, q_alpha_t, q_kind, q_eps, q_size, q_alpha, q_pre),
                 (k_weight, k_bias, k_alpha_t, k_kind, k_eps, k_size, k_alpha, k_pre),
                 num_heads, rope_style, rotary_dim, round_after_norm, layout)
    _plan(q, k, cos, sin, runtime_checks=False, **kw)
    outs = [torch.empty(q.shape, dtype=q.dtype, device=q.device)]
    if k is not None:
        outs.append(torch.empty(k.shape, dtype=k.dtype, device=k.device))
    return outs


@_library.op("ditfuse::qk_norm_rope_", mutates_args=("q", "k"))
def qk_norm_rope_inplace_op(
    q: Tensor, k: Optional[Tensor], cos: Optional[Tensor], sin: Optional[Tensor],
    positions: Optional[Tensor],
    q_weight: Optional[Tensor], q_bias: Optional[Tensor], q_alpha_t: Optional[Tensor],
    q_kind: int, q_eps: float, q_size: int, q_alpha: float, q_pre: bool,
    k_weight: Optional[Tensor], k_bias: Optional[Tensor], k_alpha_t: Optional[Tensor],
    k_kind: int, k_eps: float, k_size: int, k_alpha: float, k_pre: bool,
    num_heads: int, rope_style: str, rotary_dim: int, round_after_norm: bool, layout: str,
) -> None:
    kw = _kwargs(positions, (q_weight, q_bias, q_alpha_t, q_kind, q_eps, q_size, q_alpha, q_pre),
                 (k_weight, k_bias, k_alpha_t, k_kind, k_eps, k_size, k_alpha, k_pre),
                 num_heads, rope_style, rotary_dim, round_after_norm, layout)
    _call(q, k, cos, sin, inplace=True, **kw)


@qk_norm_rope_inplace_op.register_fake
def _(q, k, cos, sin, positions, q_weight, q_bias, q_alpha_t, q_kind, q_eps, q_size, q_alpha,
      q_pre, k_weight, k_bias, k_alpha_t, k_kind, k_eps, k_size, k_alpha, k_pre, num_heads,
      rope_style, rotary_dim, round_after_norm, layout):
    return None


@_library.op("ditfuse::qk_norm_rope_out", mutates_args=("q_out", "k_out"))
def qk_norm_rope_out_op(
    q: Tensor, k: Optional[Tensor], cos: Optional[Tensor], sin: Optional[Tensor],
    positions: Optional[Tensor],
    q_weight: Optional[Tensor], q_bias: Optional[Tensor], q_alpha_t: Optional[Tensor],
    q_kind: int, q_eps: float, q_size: int, q_alpha: float, q_pre: bool,
    k_weight: Optional[Tensor], k_bias: Optional[Tensor], k_alpha_t: Optional[Tensor],
    k_kind: int, k_eps: float, k_size: int, k_alpha: float, k_pre: bool,
    num_heads: int, rope_style: str, rotary_dim: int, round_after_norm: bool, layout: str,
    q_out: Tensor, k_out: Optional[Tensor],
) -> None:
    """The ``out=`` form: results written into the caller's buffers (the joint-attention
    processors' rows of the joint Q / K). A mutating op, so inductor writes the views of
    the joint buffer in place instead of a functional result plus a copy into the rows."""
    kw = _kwargs(positions, (q_weight, q_bias, q_alpha_t, q_kind, q_eps, q_size, q_alpha, q_pre),
                 (k_weight, k_bias, k_alpha_t, k_kind, k_eps, k_size, k_alpha, k_pre),
                 num_heads, rope_style, rotary_dim, round_after_norm, layout)
    _call(q, k, cos, sin, inplace=False, out=(q_out, k_out), **kw)


@qk_norm_rope_out_op.register_fake
def _(q, k, cos, sin, positions, q_weight, q_bias, q_alpha_t, q_kind, q_eps, q_size, q_alpha,
      q_pre, k_weight, k_bias, k_alpha_t, k_kind, k_eps, k_size, k_alpha, k_pre, num_heads,
      rope_style, rotary_dim, round_after_norm, layout, q_out, k_out):
    kw = _kwargs(positions, (q_weight, q_bias, q_alpha_t, q_kind, q_eps, q_size, q_alpha, q_pre),
                 (k_weight, k_bias, k_alpha_t, k_kind, k_eps, k_size, k_alpha, k_pre),
                 num_heads, rope_style, rotary_dim, round_after_norm, layout)
    _plan(q, k, cos, sin, runtime_checks=False, **kw)  # bad input fails while tracing
    return None


def op_args(q, k, cos, sin, *, q_norm, k_norm, num_heads, rope_style, rotary_dim, positions,
            round_after_norm, layout):
    return (q, k, cos, sin, positions, *_flatten_norm(q_norm, "q_norm"),
            *_flatten_norm(k_norm, "k_norm"), int(num_heads or 0), rope_style,
            int(rotary_dim or 0), bool(round_after_norm), layout)


def qk_norm_rope_via_op(q, k, cos, sin, *, inplace, out=None, **kw):
    args = op_args(q, k, cos, sin, **kw)
    if out is not None:
        torch.ops.ditfuse.qk_norm_rope_out(*args, out[0], out[1])
        return out[0], out[1]
    if inplace:
        torch.ops.ditfuse.qk_norm_rope_(*args)
        return q, k
    outs = torch.ops.ditfuse.qk_norm_rope(*args)
    return outs[0], (outs[1] if k is not None else None)
