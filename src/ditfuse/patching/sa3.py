"""Stable Audio 3 DiT (StableAudio3DiTModel): per-head RMS QK-norm + partial rotate-half
RoPE of the (differential) self-attention, in place on the chunks of ``to_qkv``; in the
blocks, each RMS norm with the AdaLN modulation and the gated residual before it as the AdaLN
kernels (per-op rounding, as the block computes in the activation dtype)."""

from __future__ import annotations

import torch

from ditfuse.ops.adaln import adaln_modulate, gated_residual, gated_residual_adaln
from ditfuse.ops.qk_norm_rope import qk_norm_rope
from ditfuse.patching import common


def _make_processor():
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.transformers import transformer_stable_audio3 as ts

    class DitfuseStableAudio3SelfAttnProcessor(common.Processor, ts.StableAudio3SelfAttnProcessor):
        """StableAudio3SelfAttnProcessor with q/k norm + partial RoPE fused (one kernel per
        q/k pair: (q1, k1), (q2, k2) when differential), in place on the projection chunks.

        Falls back to the original when autograd needs gradients or ``qk_norm_rope`` does not
        read a norm (``StableAudio3RMSNorm(force_fp32=False)`` computes in the activation dtype).
        """

        def __call__(self, attn, hidden_states, rope):
            ok = (
                common.norms_ok(attn.q_norm, attn.k_norm)
                and not common.needs_grad(attn, hidden_states)
                and rope is not None
                and rope.dim() == 2
            )
            if not ok:
                return super().__call__(attn, hidden_states, rope)
            S = hidden_states.shape[1]
            freqs = rope[-S:].float()  # as _apply_rotary_partial: the last S rows, in fp32
            cos, sin = freqs.cos(), freqs.sin()
            R = rope.shape[-1]

            def heads(x):
                return x.unflatten(-1, (attn.heads, attn.dim_heads))

            def qk(q, k):
                qk_norm_rope(
                    q,
                    k,
                    cos,
                    sin,
                    q_norm=attn.q_norm,
                    k_norm=attn.k_norm,
                    rope_style="half",
                    rotary_dim=R,
                    inplace=True,
                )

            if attn.use_differential:
                q1, q2, k1, k2, v = map(heads, attn.to_qkv(hidden_states).chunk(5, dim=-1))
                qk(q1, k1)
                qk(q2, k2)
                out = dispatch_attention_fn(
                    q1,
                    k1,
                    v,
                    backend=self._attention_backend,
                    parallel_config=self._parallel_config,
                ) - dispatch_attention_fn(
                    q2,
                    k2,
                    v,
                    backend=self._attention_backend,
                    parallel_config=self._parallel_config,
                )
            else:
                q, k, v = map(heads, attn.to_qkv(hidden_states).chunk(3, dim=-1))
                qk(q, k)
                out = dispatch_attention_fn(
                    q, k, v, backend=self._attention_backend, parallel_config=self._parallel_config
                )
            return attn.to_out(out.flatten(2, 3))

    return DitfuseStableAudio3SelfAttnProcessor


def _fp32_rms(n) -> bool:
    from diffusers.models.transformers.transformer_stable_audio3 import StableAudio3RMSNorm

    return type(n) is StableAudio3RMSNorm and n.force_fp32 and n.gamma.is_contiguous()


def _block_forward(
    self,
    hidden_states,
    context,
    global_modulation,
    rope,
    context_mask=None,
    local_seq=None,
    num_memory_tokens=0,
):
    """StableAudio3DiTBlock.forward as four AdaLN kernels around the attentions and the FF:
    pre_norm + modulate; ``x + attn * sigmoid(1 - gate)`` + cross_attend_norm; ``x + cross``
    + ff_norm + modulate; ``x + ff * sigmoid(1 - gate)`` (with inpainting's ``local_seq``,
    the cross-attention residual and ff_norm + modulate are two kernels around the block's
    own local addition). The RMS norms compute in fp32 and round after ``* gamma``, the rest
    rounds per op, as the eager block does. Falls back to the block's own forward for
    autograd, norms that do not force fp32, or a modulation in another dtype than the
    activations."""
    from diffusers.models.transformers.transformer_stable_audio3 import StableAudio3DiTBlock

    modulation = self.to_scale_shift_gate + global_modulation
    if (
        hidden_states.dim() != 3
        or modulation.dtype != hidden_states.dtype
        or not all(_fp32_rms(n) for n in (self.pre_norm, self.cross_attend_norm, self.ff_norm))
        or common.needs_grad(self, hidden_states, context, global_modulation)
    ):
        return StableAudio3DiTBlock.forward(
            self,
            hidden_states,
            context,
            global_modulation,
            rope,
            context_mask,
            local_seq,
            num_memory_tokens,
        )
    scale_attn, shift_attn, gate_attn, scale_ff, shift_ff, gate_ff = modulation.chunk(6, dim=-1)
    rms = dict(norm="rms", rounding="per_op")
    norm_hidden = adaln_modulate(
        hidden_states,
        shift_attn,
        scale_attn,
        weight=self.pre_norm.gamma,
        eps=self.pre_norm.eps,
        **rms,
    )
    attn_out = self.self_attn(norm_hidden, rope=rope)
    hidden_states, normed = gated_residual_adaln(
        hidden_states,
        attn_out,
        torch.sigmoid(1 - gate_attn),
        weight=self.cross_attend_norm.gamma,
        eps=self.cross_attend_norm.eps,
        **rms,
    )
    cross = self.cross_attn(normed, context=context, context_mask=context_mask)
    ff_kw = dict(weight=self.ff_norm.gamma, eps=self.ff_norm.eps, **rms)
    if local_seq is None:
        hidden_states, norm_hidden = gated_residual_adaln(
            hidden_states, cross, None, shift_ff, scale_ff, **ff_kw
        )
    else:
        hidden_states = gated_residual(hidden_states, cross, None, rounding="per_op")
        audio = hidden_states[:, num_memory_tokens:] + self.to_local_embed(local_seq)
        hidden_states = torch.cat([hidden_states[:, :num_memory_tokens], audio], dim=1)
        norm_hidden = adaln_modulate(hidden_states, shift_ff, scale_ff, **ff_kw)
    return gated_residual(
        hidden_states, self.ff(norm_hidden), torch.sigmoid(1 - gate_ff), rounding="per_op"
    )


def patch_model(model, report, *, qk_norm_rope=True, adaln=True, attention=True, activations=True):
    from diffusers.models.transformers.transformer_stable_audio3 import (
        StableAudio3DiTBlock,
        StableAudio3SelfAttnProcessor,
    )

    if qk_norm_rope:
        common.replace_processors(
            model, report, {StableAudio3SelfAttnProcessor: _make_processor()}, common.QK_LABEL
        )
    if adaln:
        common.bind_forwards(
            model,
            report,
            {StableAudio3DiTBlock: (_block_forward, "blocks (AdaLN + gated residuals)")},
        )
