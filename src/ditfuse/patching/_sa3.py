"""Stable Audio 3 DiT (StableAudio3DiTModel): per-head RMS QK-norm + partial rotate-half
RoPE of the (differential) self-attention, in place on the chunks of ``to_qkv``."""
from __future__ import annotations


from ..qk_norm_rope import qk_norm_rope
from . import grad_needed, norms_ok, params_need_grad, replace_processors


def _make_processor():
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.transformers import transformer_stable_audio3 as ts

    class DitfuseStableAudio3SelfAttnProcessor(ts.StableAudio3SelfAttnProcessor):
        """StableAudio3SelfAttnProcessor with q/k norm + partial RoPE fused (one kernel per
        q/k pair: (q1, k1), (q2, k2) when differential), in place on the projection chunks.

        Falls back to the original when autograd needs gradients or ``qk_norm_rope`` does not
        read a norm (``StableAudio3RMSNorm(force_fp32=False)`` computes in the activation dtype).
        """

        _ditfuse = True

        def __call__(self, attn, hidden_states, rope):
            ok = (norms_ok(attn.q_norm, attn.k_norm)
                  and not grad_needed(hidden_states) and not params_need_grad(attn)
                  and rope is not None and rope.dim() == 2)
            if not ok:
                return super().__call__(attn, hidden_states, rope)
            S = hidden_states.shape[1]
            freqs = rope[-S:].float()  # as _apply_rotary_partial: the last S rows, in fp32
            cos, sin = freqs.cos(), freqs.sin()
            R = rope.shape[-1]

            def heads(x):
                return x.unflatten(-1, (attn.heads, attn.dim_heads))

            def qk(q, k):
                qk_norm_rope(q, k, cos, sin, q_norm=attn.q_norm, k_norm=attn.k_norm,
                             rope_style="half", rotary_dim=R, inplace=True)

            if attn.use_differential:
                q1, q2, k1, k2, v = map(heads, attn.to_qkv(hidden_states).chunk(5, dim=-1))
                qk(q1, k1)
                qk(q2, k2)
                out = dispatch_attention_fn(
                    q1, k1, v, backend=self._attention_backend, parallel_config=self._parallel_config
                ) - dispatch_attention_fn(
                    q2, k2, v, backend=self._attention_backend, parallel_config=self._parallel_config)
            else:
                q, k, v = map(heads, attn.to_qkv(hidden_states).chunk(3, dim=-1))
                qk(q, k)
                out = dispatch_attention_fn(q, k, v, backend=self._attention_backend,
                                            parallel_config=self._parallel_config)
            return attn.to_out(out.flatten(2, 3))

    return DitfuseStableAudio3SelfAttnProcessor


def patch_model(model, report, *, qk_norm_rope=True, adaln=True, attention=True):
    from diffusers.models.transformers.transformer_stable_audio3 import StableAudio3SelfAttnProcessor

    if qk_norm_rope:
        replace_processors(model, report, {StableAudio3SelfAttnProcessor: _make_processor()},
                           "attention processors (QK-norm + RoPE)")
