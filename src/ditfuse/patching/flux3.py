"""FLUX.3 (Flux3Transformer2DModel): per-head QK-norm + RoPE of its one attention processor
(per-mode and joint single blocks alike) as one kernel. FLUX.3 normalises and rotates in
fp32 and casts back once (``norm_q(query.float())``, the rotation in fp32, then
``.to(value.dtype)``: "a single cast back, matching the BFL implementation"), which is
``qk_norm_rope(..., round_after_norm=False)`` on the projections as they are (their fp32
upcast is exact). In the blocks, the per-token norm + modulate and the gated residual as the
AdaLN kernels (per-op rounding, as the blocks compute in the activation dtype; the joint
blocks' two streams modulated straight into the rows of the sequence the attention reads,
no ``torch.cat``), and every ``Flux3SwiGLU`` as one kernel."""

from __future__ import annotations

import torch

from ditfuse.ops.adaln import adaln_modulate, gated_residual
from ditfuse.ops.qk_norm_rope import qk_norm_rope
from ditfuse.patching import common
from ditfuse.patching.flux import qk_ok
from ditfuse.patching.flux2 import _swiglu_forward


def _mods_ok(x, mod) -> bool:
    """A per-token (or per-batch-entry) (B|1, S|1, 3 D) modulation in x's dtype, as the
    per-op AdaLN kernels read it."""
    return (
        isinstance(mod, torch.Tensor)
        and mod.dim() == 3
        and mod.dtype == x.dtype
        and mod.shape[0] in (1, x.shape[0])
        and mod.shape[1] in (1, x.shape[1])
        and mod.shape[2] == 3 * x.shape[2]
    )


def _blocks_ok(self, *pairs) -> bool:
    return (
        common.plain_layer_norms(self.norm)
        and not common.params_need_grad(self)
        and all(x.dim() == 3 and _mods_ok(x, m) and not common.grad_needed(x, m) for x, m in pairs)
    )


def _modulate(self, x, shift, scale, out=None):
    return adaln_modulate(
        x, shift, scale, norm="layer", eps=self.norm.eps, rounding="per_op", out=out
    )


def _mode_block_forward(self, hidden_states, temb_mod, image_rotary_emb):
    """Flux3ModeTransformerBlock.forward with ``(1 + scale) * norm(x) + shift`` and
    ``x + gate * (attn + ff)`` as the AdaLN kernels (the same per-op roundings)."""
    if not _blocks_ok(self, (hidden_states, temb_mod)):
        return type(self).forward(self, hidden_states, temb_mod, image_rotary_emb)
    shift, scale, gate = torch.chunk(temb_mod, 3, dim=-1)
    norm_hidden_states = _modulate(self, hidden_states, shift, scale)
    attn_output = self.attn(hidden_states=norm_hidden_states, image_rotary_emb=image_rotary_emb)
    ff_output = self.ff(norm_hidden_states)
    return gated_residual(hidden_states, attn_output + ff_output, gate, rounding="per_op")


def _single_block_forward(
    self, hidden_states, encoder_hidden_states, temb_mod, temb_mod_context, image_rotary_emb
):
    """Flux3SingleTransformerBlock.forward with each stream's norm + modulate written into its
    rows of the joint (text first) sequence, and the two gated residuals, as the AdaLN
    kernels (the same per-op roundings)."""
    x, c = hidden_states, encoder_hidden_states
    if not (
        _blocks_ok(self, (x, temb_mod), (c, temb_mod_context))
        and x.dtype == c.dtype
        and x.shape[0] == c.shape[0]
    ):
        return type(self).forward(
            self, hidden_states, encoder_hidden_states, temb_mod, temb_mod_context, image_rotary_emb
        )
    shift, scale, gate = torch.chunk(temb_mod, 3, dim=-1)
    c_shift, c_scale, c_gate = torch.chunk(temb_mod_context, 3, dim=-1)
    T = c.shape[1]
    if common.compiling():  # under torch.compile the op is functional: inductor places the rows
        combined = torch.cat(
            [_modulate(self, c, c_shift, c_scale), _modulate(self, x, shift, scale)], dim=1
        )
    else:
        combined = x.new_empty(x.shape[0], T + x.shape[1], x.shape[2])
        _modulate(self, c, c_shift, c_scale, out=combined[:, :T])
        _modulate(self, x, shift, scale, out=combined[:, T:])
    attn_output = self.attn(hidden_states=combined, image_rotary_emb=image_rotary_emb)
    ff_output = self.ff(combined)
    output = attn_output + ff_output
    context_output, content_output = torch.split(output, [T, x.shape[1]], dim=1)
    c = gated_residual(c, context_output, c_gate, rounding="per_op")
    x = gated_residual(x, content_output, gate, rounding="per_op")
    return c, x


def _make_processor():
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.transformers import transformer_flux3 as t3

    class DitfuseFlux3AttnProcessor(common.Processor, t3.Flux3AttnProcessor):
        """Flux3AttnProcessor with QK-norm + RoPE in one kernel (fp32 math, one rounding
        to the value dtype, as the eager processor). Falls back to the original when
        autograd needs gradients, a q/k norm is not one ``qk_norm_rope`` reads, the
        projections are not in the value's dtype, or the RoPE is not a (cos, sin) pair of
        (S, D) tables."""

        def __call__(self, attn, hidden_states, attention_mask=None, image_rotary_emb=None):
            if not qk_ok(attn, hidden_states, None, image_rotary_emb, False):
                return super().__call__(attn, hidden_states, attention_mask, image_rotary_emb)
            query, key, value = t3._get_qkv_projections(attn, hidden_states)
            if not (query.dtype == key.dtype == value.dtype):
                return super().__call__(attn, hidden_states, attention_mask, image_rotary_emb)
            H = attn.heads
            query = query.unflatten(-1, (H, -1))
            key = key.unflatten(-1, (H, -1))
            value = value.unflatten(-1, (H, -1))
            cos, sin = image_rotary_emb if image_rotary_emb is not None else (None, None)
            # fp32 from the projection to the cast: no rounding after the norm
            query, key = qk_norm_rope(
                query, key, cos, sin, q_norm=attn.norm_q, k_norm=attn.norm_k, round_after_norm=False
            )
            hidden_states = common.sdpa(
                self, dispatch_attention_fn, query, key, value, attention_mask
            )
            hidden_states = attn.to_out[0](hidden_states)
            return attn.to_out[1](hidden_states)

    return DitfuseFlux3AttnProcessor


def patch_model(model, report, *, qk_norm_rope=True, adaln=True, attention=True, activations=True):
    from diffusers.models.transformers import transformer_flux3 as t3

    if qk_norm_rope:
        common.replace_processors(
            model, report, {t3.Flux3AttnProcessor: _make_processor()}, common.QK_LABEL
        )
    table = {}
    if adaln:
        table[t3.Flux3ModeTransformerBlock] = (
            _mode_block_forward,
            "mode blocks (modulate + gated residual)",
        )
        table[t3.Flux3SingleTransformerBlock] = (
            _single_block_forward,
            "joint blocks (modulate + gated residuals)",
        )
    if activations:
        table[t3.Flux3SwiGLU] = (_swiglu_forward, "SwiGLU activations (one kernel)")
    common.bind_forwards(model, report, table)
