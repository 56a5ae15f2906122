"""FLUX.2 (Flux2Transformer2DModel): per-head QK-norm + RoPE in the double-stream processor
and, from the strided Q/K views of the fused ``to_qkv_mlp_proj`` output into fresh Q/K, in
the single-stream (parallel) processor; in the blocks, every norm + modulation and gated
residual of the eager code as the AdaLN kernels (per-op rounding, as the blocks compute in
the activation dtype); every ``Flux2SwiGLU`` as one kernel, and in the single-stream
processor the SwiGLU written straight into the buffer ``to_out`` reads (no ``torch.cat``)."""

from __future__ import annotations

import torch

from ditfuse.ops.activations import supported, swiglu
from ditfuse.ops.adaln import gated_residual
from ditfuse.patching import common, streams
from ditfuse.patching.flux import joint_processor, qk_ok
from ditfuse.patching.linear_fp8 import linear_residual, unhooked

_PARALLEL_ACT_LABEL = "single-stream processors (QK-norm + RoPE, SwiGLU into the concat buffer)"


def _is_swiglu(m) -> bool:
    """A Flux2SwiGLU whose gate is the plain SiLU the kernel computes."""
    from diffusers.models.transformers.transformer_flux2 import Flux2SwiGLU

    return type(m) is Flux2SwiGLU and type(m.gate_fn) is torch.nn.SiLU


def _swiglu_forward(self, x):
    """Flux2SwiGLU.forward (``silu(x[..., :H]) * x[..., H:]``; FLUX.3's Flux3SwiGLU is the
    same code) as one kernel with the eager ops' arithmetic and roundings
    (``ditfuse.swiglu``); the class's own forward when its gate is not a plain SiLU, autograd
    needs gradients, the kernel does not take ``x`` as it is (dtype, device, strides, odd
    width), or under torch.compile (inductor fuses the same two ops, faster there:
    docs/patching.md)."""
    if common.compiling() or type(self.gate_fn) is not torch.nn.SiLU or not supported(x, "swiglu"):
        return type(self).forward(self, x)
    return swiglu(x)


def _out(attn, hidden_states, encoder_hidden_states):
    """Flux2AttnProcessor's output step: the text rows (if any) through ``to_add_out``, the
    image rows through ``to_out``."""
    if encoder_hidden_states is not None:
        encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
    hidden_states = attn.to_out[0](hidden_states)
    hidden_states = attn.to_out[1](hidden_states)
    if encoder_hidden_states is not None:
        return hidden_states, encoder_hidden_states
    return hidden_states


def _make_processors(fuse_act: bool = True):
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.transformers import transformer_flux2 as t2

    class DitfuseFlux2ParallelSelfAttnProcessor(
        common.EightBitProcessor, t2.Flux2ParallelSelfAttnProcessor
    ):
        """Flux2ParallelSelfAttnProcessor with QK-norm + RoPE read from the Q/K views of the
        fused QKV+MLP projection into fresh Q/K (V and the MLP half are never touched) and, with
        ``fuse_act``, the SwiGLU of the MLP columns written into the MLP half of the buffer
        ``to_out`` reads (the attention output copied into the other half): the same
        values as ``torch.cat([attn, mlp_act_fn(mlp)], -1)`` without the activation's own
        tensor and the cat's second copy. Falls back to the original in the same cases as
        the double-stream processor; to ``mlp_act_fn`` + cat when it is not a Flux2SwiGLU
        or the kernel cannot take the input. With ``patch(attention="fp8")`` the attention
        on 8 bits where the call allows it (``common.use_8bit``, ``common.attend``; a
        key-padding mask the kernel's ``key_mask``), Q / K from the kernel as
        ``common.qk_8bit`` says.

        ``residual_gate=(x, gate)`` (from ditfuse's single-stream block forward) returns
        ``ditfuse.gated_residual(x, out, gate, rounding="per_op")`` of the processor's output
        ``out`` instead, bit for bit: an FP8 ``to_out`` takes it into its GEMM
        (``linear_fp8.linear_residual``)."""

        takes_residual_gate = True

        def __init__(self, fuse_act: bool = fuse_act):  # default: patch(activations=...)
            super().__init__()
            self._fuse_act = fuse_act

        def __call__(
            self,
            attn,
            hidden_states,
            attention_mask=None,
            image_rotary_emb=None,
            residual_gate=None,
        ):
            def project(buffer):
                if residual_gate is None:
                    return attn.to_out(buffer)
                return linear_residual(attn.to_out, buffer, *residual_gate, rounding="per_op")

            if not qk_ok(attn, hidden_states, None, image_rotary_emb, False):
                out = super().__call__(attn, hidden_states, attention_mask, image_rotary_emb)
                if residual_gate is None:
                    return out
                x, gate = residual_gate
                return gated_residual(x, out, gate, rounding="per_op")
            hidden_states = attn.to_qkv_mlp_proj(hidden_states)
            qkv_dim = 3 * attn.inner_dim
            mlp_dim = attn.mlp_hidden_dim * attn.mlp_mult_factor
            local_qkv = hidden_states.shape[-1] * qkv_dim // (qkv_dim + mlp_dim)
            qkv, mlp_hidden_states = torch.split(
                hidden_states, [local_qkv, hidden_states.shape[-1] - local_qkv], dim=-1
            )
            query, key, value = qkv.chunk(3, dim=-1)
            D = attn.head_dim
            query = query.unflatten(-1, (-1, D))
            key = key.unflatten(-1, (-1, D))
            value = value.unflatten(-1, (-1, D))
            cos, sin = image_rotary_emb if image_rotary_emb is not None else (None, None)

            def attend_16bit(query, key, value):
                # into fresh Q / K (contiguous for the attention) rather than in place on the
                # projection's chunks: the same bits, faster (docs/design/qk_norm_rope.md)
                query, key = common.attn_qk_norm_rope(attn, query, key, cos, sin)
                return common.sdpa(self, dispatch_attention_fn, query, key, value, attention_mask)

            def attend_8bit(query, key, value, key_mask=None):
                quantize = common.qk_8bit(key_mask)
                qk = common.attn_qk_norm_rope(attn, query, key, cos, sin, quantize=quantize)
                return common.attention_8bit(qk, value, key_mask=key_mask).flatten(2, 3)

            hidden_states = common.attend(
                common.use_8bit(self, query, value, D, attention_mask, self._parallel_config),
                attention_mask,
                attend_8bit,
                attend_16bit,
                (query, key, value),
                keys=tuple(key.shape[:2]),
            )
            if (
                self._fuse_act
                and _is_swiglu(attn.mlp_act_fn)
                and common.cat_fusable(hidden_states, mlp_hidden_states, "swiglu")
            ):
                return project(
                    common.cat_activation(
                        hidden_states, mlp_hidden_states, swiglu, mlp_hidden_states.shape[-1] // 2
                    )
                )
            mlp_hidden_states = attn.mlp_act_fn(mlp_hidden_states)
            return project(torch.cat([hidden_states, mlp_hidden_states], dim=-1))

    return {
        t2.Flux2AttnProcessor: joint_processor(
            t2.Flux2AttnProcessor, t2._get_qkv_projections, _out
        ),
        t2.Flux2ParallelSelfAttnProcessor: DitfuseFlux2ParallelSelfAttnProcessor,
    }


def _fusable(block, norms, x, *ts) -> bool:
    """Affine-free LayerNorms, no autograd, and every tensor of the chain in x's dtype (the
    eager block rounds each step to it: ``rounding="per_op"``)."""
    return (
        common.plain_layer_norms(*norms)
        and x.dim() == 3
        and not common.needs_grad(block, x, *ts)
        and all(t.dtype == x.dtype for t in ts)
    )


def _block_forward(
    self,
    hidden_states,
    encoder_hidden_states,
    temb_mod_img,
    temb_mod_txt,
    image_rotary_emb=None,
    joint_attention_kwargs=None,
):
    """Flux2TransformerBlock.forward with, per stream, norm1 + modulate, ``x + gate * attn``
    + norm2 + modulate, and ``x + gate * ff`` each as one kernel."""
    from diffusers.models.transformers.transformer_flux2 import (
        Flux2Modulation,
        Flux2TransformerBlock,
    )

    if not _fusable(
        self,
        (self.norm1, self.norm1_context, self.norm2, self.norm2_context),
        hidden_states,
        encoder_hidden_states,
        temb_mod_img,
        temb_mod_txt,
    ):
        return Flux2TransformerBlock.forward(
            self,
            hidden_states,
            encoder_hidden_states,
            temb_mod_img,
            temb_mod_txt,
            image_rotary_emb,
            joint_attention_kwargs,
        )
    (shift_msa, scale_msa, gate_msa), (shift_mlp, scale_mlp, gate_mlp) = Flux2Modulation.split(
        temb_mod_img, 2
    )
    (c_shift_msa, c_scale_msa, c_gate_msa), (c_shift_mlp, c_scale_mlp, c_gate_mlp) = (
        Flux2Modulation.split(temb_mod_txt, 2)
    )
    norm_hidden_states = common.per_op_modulate(hidden_states, shift_msa, scale_msa, self.norm1)
    norm_encoder_hidden_states = common.per_op_modulate(
        encoder_hidden_states, c_shift_msa, c_scale_msa, self.norm1_context
    )
    attn_output, context_attn_output = self.attn(
        hidden_states=norm_hidden_states,
        encoder_hidden_states=norm_encoder_hidden_states,
        image_rotary_emb=image_rotary_emb,
        **(joint_attention_kwargs or {}),
    )
    mods = (gate_msa, shift_mlp, scale_mlp, gate_mlp)
    c_mods = (c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp)
    hidden_states, encoder_hidden_states = streams.mlp_tails(
        self,
        hidden_states,
        encoder_hidden_states,
        attn_output,
        context_attn_output,
        mods,
        c_mods,
        True,
    )
    return encoder_hidden_states, hidden_states


def _takes_residual_gate(attn, kwargs) -> bool:
    """Whether the single-stream block may hand its gated residual to ``attn``'s processor:
    ditfuse's, and no hook on ``attn`` (a forward hook would see the new stream, not the
    attention's output)."""
    return (
        getattr(attn.processor, "takes_residual_gate", False)
        and "residual_gate" not in kwargs
        and unhooked(attn)
    )


def _single_block_forward(
    self,
    hidden_states,
    encoder_hidden_states,
    temb_mod,
    image_rotary_emb=None,
    joint_attention_kwargs=None,
    split_hidden_states=False,
    text_seq_len=None,
):
    """Flux2SingleTransformerBlock.forward with norm + modulate and ``x + gate * attn`` each
    as one kernel."""
    from diffusers.models.transformers.transformer_flux2 import (
        Flux2Modulation,
        Flux2SingleTransformerBlock,
    )

    ts = (temb_mod,) + ((encoder_hidden_states,) if encoder_hidden_states is not None else ())
    if not _fusable(self, (self.norm,), hidden_states, *ts):
        return Flux2SingleTransformerBlock.forward(
            self,
            hidden_states,
            encoder_hidden_states,
            temb_mod,
            image_rotary_emb,
            joint_attention_kwargs,
            split_hidden_states,
            text_seq_len,
        )
    if encoder_hidden_states is not None:
        text_seq_len = encoder_hidden_states.shape[1]
        hidden_states = torch.cat([encoder_hidden_states, hidden_states], dim=1)
    mod_shift, mod_scale, mod_gate = Flux2Modulation.split(temb_mod, 1)[0]
    norm_hidden_states = common.per_op_modulate(hidden_states, mod_shift, mod_scale, self.norm)
    kwargs = dict(joint_attention_kwargs or {})
    if _takes_residual_gate(self.attn, kwargs):
        # the processor returns x + gate * its output (in to_out's GEMM where that is FP8)
        hidden_states = self.attn(
            hidden_states=norm_hidden_states,
            image_rotary_emb=image_rotary_emb,
            residual_gate=(hidden_states, mod_gate),
            **kwargs,
        )
    else:
        attn_output = self.attn(
            hidden_states=norm_hidden_states, image_rotary_emb=image_rotary_emb, **kwargs
        )
        hidden_states = gated_residual(hidden_states, attn_output, mod_gate, rounding="per_op")
    if hidden_states.dtype == torch.float16:
        hidden_states = hidden_states.clip(-65504, 65504)
    if split_hidden_states:
        return hidden_states[:, :text_seq_len], hidden_states[:, text_seq_len:]
    return hidden_states


def patch_model(model, report, *, qk_norm_rope=True, adaln=True, attention=True, activations=True):
    from diffusers.models.transformers import transformer_flux2 as t2
    from diffusers.models.transformers.transformer_flux2 import (
        Flux2SingleTransformerBlock,
        Flux2TransformerBlock,
    )

    if qk_norm_rope:
        procs = _make_processors(activations)
        common.replace_qk_processors(
            model, report, {t2.Flux2AttnProcessor: procs[t2.Flux2AttnProcessor]}, attention
        )
        common.replace_qk_processors(
            model,
            report,
            {t2.Flux2ParallelSelfAttnProcessor: procs[t2.Flux2ParallelSelfAttnProcessor]},
            attention,
            _PARALLEL_ACT_LABEL if activations else common.QK_LABEL,
        )
    if activations:
        common.bind_forwards(
            model, report, {t2.Flux2SwiGLU: (_swiglu_forward, "SwiGLU activations (one kernel)")}
        )
    if adaln:
        common.bind_forwards(
            model,
            report,
            {
                Flux2TransformerBlock: (_block_forward, "blocks (AdaLN + gated residuals)"),
                Flux2SingleTransformerBlock: (
                    _single_block_forward,
                    "single blocks (AdaLN + gated residual)",
                ),
            },
        )
