"""FLUX.3 (Flux3Transformer2DModel): per-head QK-norm + RoPE of its one attention processor
(per-mode and joint single blocks alike) as one kernel. FLUX.3 normalises and rotates in
fp32 and casts back once (``norm_q(query.float())``, the rotation in fp32, then
``.to(value.dtype)``: "a single cast back, matching the BFL implementation"), which is
``qk_norm_rope(..., round_after_norm=False)`` on the projections as they are (their fp32
upcast is exact). The blocks are left as they are."""
from __future__ import annotations

from ..qk_norm_rope import qk_norm_rope
from ._flux import qk_ok
from . import replace_processors

_PROC_LABEL = "attention processors (QK-norm + RoPE)"


def _make_processor():
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.transformers import transformer_flux3 as t3

    class DitfuseFlux3AttnProcessor(t3.Flux3AttnProcessor):
        """Flux3AttnProcessor with QK-norm + RoPE in one kernel (fp32 math, one rounding
        to the value dtype, as the eager processor). Falls back to the original when
        autograd needs gradients, a q/k norm is not one ``qk_norm_rope`` reads, the
        projections are not in the value's dtype, or the RoPE is not a (cos, sin) pair of
        (S, D) tables."""

        _ditfuse = True

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
            query, key = qk_norm_rope(query, key, cos, sin, q_norm=attn.norm_q,
                                      k_norm=attn.norm_k, round_after_norm=False)
            hidden_states = dispatch_attention_fn(
                query, key, value, attn_mask=attention_mask, backend=self._attention_backend,
                parallel_config=self._parallel_config)
            hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
            hidden_states = attn.to_out[0](hidden_states)
            return attn.to_out[1](hidden_states)

    return DitfuseFlux3AttnProcessor


def patch_model(model, report, *, qk_norm_rope=True, adaln=True, attention=True,
                activations=True):
    from diffusers.models.transformers.transformer_flux3 import Flux3AttnProcessor

    if qk_norm_rope:
        replace_processors(model, report, {Flux3AttnProcessor: _make_processor()}, _PROC_LABEL)
