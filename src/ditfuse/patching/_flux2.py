"""FLUX.2 (Flux2Transformer2DModel): per-head QK-norm + RoPE in the double-stream processor
and, in place on the strided Q/K views of the fused ``to_qkv_mlp_proj`` output, in the
single-stream (parallel) processor."""
from __future__ import annotations

import torch

from ..qk_norm_rope import qk_norm_rope
from . import replace_processors
from ._flux import joint_qk, qk_ok


def _make_processors():
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.transformers import transformer_flux2 as t2

    class DitfuseFlux2AttnProcessor(t2.Flux2AttnProcessor):
        """Flux2AttnProcessor with each stream's QK-norm + RoPE in one kernel, written into
        its slice of the joint Q/K. Falls back to the original when autograd needs
        gradients, a q/k norm is not an RMSNorm, or the RoPE is not a (cos, sin) pair."""

        _ditfuse = True

        def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                     image_rotary_emb=None):
            joint = attn.added_kv_proj_dim is not None and encoder_hidden_states is not None
            if not qk_ok(attn, hidden_states, encoder_hidden_states, image_rotary_emb, joint) or \
                    (attn.added_kv_proj_dim is not None and encoder_hidden_states is None):
                return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask,
                                        image_rotary_emb)
            query, key, value, encoder_query, encoder_key, encoder_value = t2._get_qkv_projections(
                attn, hidden_states, encoder_hidden_states)
            query, key, value = joint_qk(attn, query, key, value, encoder_query, encoder_key,
                                         encoder_value, image_rotary_emb, joint)
            hidden_states = dispatch_attention_fn(
                query, key, value, attn_mask=attention_mask, backend=self._attention_backend,
                parallel_config=self._parallel_config)
            hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
            if encoder_hidden_states is not None:
                encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
                    [encoder_hidden_states.shape[1],
                     hidden_states.shape[1] - encoder_hidden_states.shape[1]], dim=1)
                encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
            hidden_states = attn.to_out[0](hidden_states)
            hidden_states = attn.to_out[1](hidden_states)
            if encoder_hidden_states is not None:
                return hidden_states, encoder_hidden_states
            return hidden_states

    class DitfuseFlux2ParallelSelfAttnProcessor(t2.Flux2ParallelSelfAttnProcessor):
        """Flux2ParallelSelfAttnProcessor with QK-norm + RoPE done in place on the Q/K views
        of the fused QKV+MLP projection (V and the MLP half are never touched). Falls back to
        the original in the same cases as the double-stream processor."""

        _ditfuse = True

        def __call__(self, attn, hidden_states, attention_mask=None, image_rotary_emb=None):
            if not qk_ok(attn, hidden_states, None, image_rotary_emb, False):
                return super().__call__(attn, hidden_states, attention_mask, image_rotary_emb)
            hidden_states = attn.to_qkv_mlp_proj(hidden_states)
            qkv_dim = 3 * attn.inner_dim
            mlp_dim = attn.mlp_hidden_dim * attn.mlp_mult_factor
            local_qkv = hidden_states.shape[-1] * qkv_dim // (qkv_dim + mlp_dim)
            qkv, mlp_hidden_states = torch.split(
                hidden_states, [local_qkv, hidden_states.shape[-1] - local_qkv], dim=-1)
            query, key, value = qkv.chunk(3, dim=-1)
            D = attn.head_dim
            query = query.unflatten(-1, (-1, D))
            key = key.unflatten(-1, (-1, D))
            value = value.unflatten(-1, (-1, D))
            cos, sin = image_rotary_emb if image_rotary_emb is not None else (None, None)
            qk_norm_rope(query, key, cos, sin, q_norm=attn.norm_q, k_norm=attn.norm_k, inplace=True)
            hidden_states = dispatch_attention_fn(
                query, key, value, attn_mask=attention_mask, backend=self._attention_backend,
                parallel_config=self._parallel_config)
            hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
            mlp_hidden_states = attn.mlp_act_fn(mlp_hidden_states)
            hidden_states = torch.cat([hidden_states, mlp_hidden_states], dim=-1)
            return attn.to_out(hidden_states)

    return {t2.Flux2AttnProcessor: DitfuseFlux2AttnProcessor,
            t2.Flux2ParallelSelfAttnProcessor: DitfuseFlux2ParallelSelfAttnProcessor}


def patch_model(model, report, *, qk_norm_rope=True, adaln=True, attention=True):
    if qk_norm_rope:
        replace_processors(model, report, _make_processors(), "attention processors (QK-norm + RoPE)")
