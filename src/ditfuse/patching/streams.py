"""The FLUX-style stream tails shared by the double- and single-stream blocks (FLUX.1, FLUX.2,
HunyuanVideo, Qwen-Image): the MLP half of a stream and the single-stream block, each ending in
the block's gated residual, which an FP8 output projection takes into its GEMM
(``linear_fp8.ffn_residual``, ``linear_fp8.linear_residual``). Apart from
:mod:`ditfuse.patching.common` because the FP8 linears' patch imports that module."""

from __future__ import annotations

from typing import Callable

import torch

from ditfuse.ops.adaln import gated_residual_adaln
from ditfuse.patching import common
from ditfuse.patching.linear_fp8 import ffn_residual, linear_residual


def per_op_mlp_tail(x, attn_out, gate_msa, shift_mlp, scale_mlp, gate_mlp, norm2, ff):
    """The second half of a FLUX-style stream computing in the activation dtype:
    ``x + gate_msa * attn_out`` -> ``norm2`` (affine-free LayerNorm) -> ``* (1 + scale_mlp) +
    shift_mlp`` -> ``ff`` -> ``x + gate_mlp * ff(...)``, as two AdaLN kernels around the FF
    (``rounding="per_op"``: every step rounded as the eager block rounds it)."""
    x, n = gated_residual_adaln(
        x, attn_out, gate_msa, shift_mlp, scale_mlp, norm="layer", eps=norm2.eps, rounding="per_op"
    )
    return ffn_residual(ff, n, x, gate_mlp, rounding="per_op")


def mlp_tails(block, x, c, attn_out, c_attn_out, mods, c_mods, clip16: bool = False):
    """Both streams' second halves in a FLUX-style double-stream block (FLUX.1, FLUX.2,
    HunyuanVideo): :func:`per_op_mlp_tail` of the image stream ``x`` through ``norm2`` /
    ``ff`` and of the text stream ``c`` through ``norm2_context`` / ``ff_context``, each with
    its ``(gate_msa, shift_mlp, scale_mlp, gate_mlp)``; with ``clip16`` the text stream
    clipped to float16's range in float16 (as FLUX's blocks do). Returns ``(x, c)``."""
    x = per_op_mlp_tail(x, attn_out, *mods, block.norm2, block.ff)
    c = per_op_mlp_tail(c, c_attn_out, *c_mods, block.norm2_context, block.ff_context)
    if clip16 and c.dtype == torch.float16:
        c = c.clip(-65504, 65504)
    return x, c


def single_block(block, streams, temb, attend: Callable, fuse_act: bool) -> torch.Tensor:
    """A FLUX-style single-stream block (FLUX.1, HunyuanVideo) on the two ``streams`` joined
    in the model's token order (``common.join_tokens``): ``block.norm`` (norm + modulate, and
    the gate), ``attend(normed)`` (the attention output, or its token parts in order) next to
    ``act_mlp(proj_mlp(normed))`` -- with ``fuse_act`` the GELU written into the concat
    buffer (``common.gelu_into_buffer``) -- then ``x + gate * proj_out(...)``
    (:func:`~ditfuse.patching.linear_fp8.linear_residual`: one kernel; in the FP8 GEMM where
    ``proj_out`` is FP8), per-op rounding as the blocks compute in the activation dtype.
    (B, N, C)."""
    # the previous single block's output halves: joined as a view, not copied again
    hidden_states = common.join_tokens(*streams)
    norm_hidden_states, gate = block.norm(hidden_states, emb=temb)
    mlp_hidden_states = block.proj_mlp(norm_hidden_states)
    parts = common._parts(attend(norm_hidden_states))
    out = common.gelu_into_buffer(block.act_mlp, mlp_hidden_states, parts) if fuse_act else None
    if out is None:
        attn_output = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        out = torch.cat([attn_output, block.act_mlp(mlp_hidden_states)], dim=2)
    return linear_residual(block.proj_out, out, hidden_states, gate, rounding="per_op")
