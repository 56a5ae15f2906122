"""Qwen-Image (QwenImageTransformer2DModel) and Qwen-Image 2.1 (QwenImage21Transformer2DModel:
its processors' QK-norm + RoPE only): per-head QK-norm + RoPE of the text and image
streams, each written into its slice of the joint Q/K. Qwen's RoPE is a complex multiply;
``x * (c + i s)`` on pairs (2i, 2i+1) is the interleaved rotation with the unique-frequency
tables ``c = freqs.real``, ``s = freqs.imag`` (packed contiguous once per table:
``table_once``). In the blocks, each
stream's norm1 + modulate, gated residual + norm2 + modulate and MLP gated residual as the
AdaLN kernels (per-op rounding, as the block computes in the activation dtype)."""

from __future__ import annotations

import torch

from ditfuse.patching import common, streams


def _real(f):
    return torch.view_as_real(f)[..., 0].contiguous()


def _imag(f):
    return torch.view_as_real(f)[..., 1].contiguous()


def _cs(freqs):
    """cos, sin of complex frequencies as contiguous (S, D/2) tables, made once per table:
    the kernel's half-width path reads them with one load a pair, where the strided real /
    imaginary views cost it a layout change through shared memory (docs/qk_norm_rope.md)."""
    return common.table_once(freqs, "real", _real), common.table_once(freqs, "imag", _imag)


def _make_processor():
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.transformers import transformer_qwenimage as tq

    class DitfuseQwenDoubleStreamAttnProcessor(
        common.EightBitProcessor, tq.QwenDoubleStreamAttnProcessor2_0
    ):
        """QwenDoubleStreamAttnProcessor2_0 with each stream's QK-norm + RoPE in one kernel.

        Falls back to the original when autograd needs gradients, a q/k norm is not an
        RMSNorm, or the RoPE is not an (image, text) pair of complex (S, D/2) tables.

        With ``patch(attention="fp8")``: each stream's Q / K from its kernel as
        ``common.qk_8bit`` says (16-bit on a GPU, int8 under the interpreter), concatenated
        text first, and the attention on
        ``ditfuse.attention(..., precision="fp8")`` where the call allows it
        (``common.use_8bit``, ``common.attend``): the joint mask built from a boolean
        ``encoder_hidden_states_mask`` (the model's forward makes it one) is a key-padding
        mask, the kernel's ``key_mask``; a float prompt mask (the processor called with one:
        the joint mask an additive bias) 8-bit only where it is all zero.
        """

        def __call__(
            self,
            attn,
            hidden_states,
            encoder_hidden_states=None,
            encoder_hidden_states_mask=None,
            attention_mask=None,
            image_rotary_emb=None,
        ):
            norms = (attn.norm_q, attn.norm_k, attn.norm_added_q, attn.norm_added_k)
            ok = (
                encoder_hidden_states is not None
                and attention_mask is None
                and common.norms_ok(*norms)
                and not common.needs_grad(attn, hidden_states, encoder_hidden_states)
            )
            if ok and image_rotary_emb is not None:
                ok = (
                    isinstance(image_rotary_emb, (tuple, list))
                    and len(image_rotary_emb) == 2
                    and all(f.is_complex() and f.dim() == 2 for f in image_rotary_emb)
                    and image_rotary_emb[0].shape[0] == hidden_states.shape[1]
                    and image_rotary_emb[1].shape[0] == encoder_hidden_states.shape[1]
                )
            if not ok:
                return super().__call__(
                    attn,
                    hidden_states,
                    encoder_hidden_states,
                    encoder_hidden_states_mask,
                    attention_mask,
                    image_rotary_emb,
                )
            if encoder_hidden_states_mask is not None:
                image_mask = torch.ones(
                    (hidden_states.shape[0], hidden_states.shape[1]),
                    dtype=torch.bool,
                    device=hidden_states.device,
                )
                attention_mask = torch.cat([encoder_hidden_states_mask, image_mask], dim=1)
                attention_mask = attention_mask[:, None, None, :]
            T = encoder_hidden_states.shape[1]
            D = attn.inner_dim // attn.heads

            def heads(x):
                return x.unflatten(-1, (-1, D))

            img_q, img_k, img_v = map(
                heads,
                (attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)),
            )
            txt_q, txt_k, txt_v = map(
                heads,
                (
                    attn.add_q_proj(encoder_hidden_states),
                    attn.add_k_proj(encoder_hidden_states),
                    attn.add_v_proj(encoder_hidden_states),
                ),
            )
            if image_rotary_emb is not None:
                (ic, is_), (tc, ts) = _cs(image_rotary_emb[0]), _cs(image_rotary_emb[1])
                rot = dict(rotary_dim=D)
            else:
                ic = is_ = tc = ts = None
                rot = {}
            v = torch.cat([txt_v, img_v], dim=1)

            def streams(img_q, img_k, txt_q, txt_k):  # text first, each with its tables
                return [
                    common.qk_stream(
                        txt_q, txt_k, attn.norm_added_q, attn.norm_added_k, cos=tc, sin=ts, **rot
                    ),
                    common.qk_stream(
                        img_q, img_k, attn.norm_q, attn.norm_k, cos=ic, sin=is_, **rot
                    ),
                ]

            def attend_16bit(img_q, img_k, txt_q, txt_k, v):
                q, k = common.joint_qk(streams(img_q, img_k, txt_q, txt_k), like=1)
                return common.sdpa(self, dispatch_attention_fn, q, k, v, attention_mask)

            def attend_8bit(img_q, img_k, txt_q, txt_k, v, key_mask=None):
                qk = common.joint_qk(
                    streams(img_q, img_k, txt_q, txt_k), common.qk_8bit(key_mask), like=1
                )
                return common.attention_8bit(qk, v, key_mask=key_mask).flatten(2, 3)

            eight = common.use_8bit(self, img_q, v, D, attention_mask, self._parallel_config)
            joint = common.attend(
                eight,
                attention_mask,
                attend_8bit,
                attend_16bit,
                (img_q, img_k, txt_q, txt_k, v),
                keys=tuple(v.shape[:2]),
            )
            return self._out(attn, joint, T)

        @staticmethod
        def _out(attn, joint, T):
            """The joint attention output's text and image rows through their projections."""
            txt_out, img_out = joint[:, :T, :], joint[:, T:, :]
            img_out = attn.to_out[0](img_out.contiguous())
            if len(attn.to_out) > 1:
                img_out = attn.to_out[1](img_out)
            txt_out = attn.to_add_out(txt_out.contiguous())
            return img_out, txt_out

    return DitfuseQwenDoubleStreamAttnProcessor


def _make_processor_21(base):
    """The fused subclass of a Qwen-Image 2.1 processor class (``QwenImage21AttnProcessor``
    or ``QwenImage21FlexAttnProcessor``: both take Q / K / V from the same helper)."""

    class DitfuseQwenImage21AttnProcessor(common.Processor, base):
        """Qwen-Image 2.1's processor with QK-norm + RoPE in one kernel: the helper's
        ``norm_q(q).to(value.dtype)`` then the complex rotation, as one ``qk_norm_rope`` call
        (Qwen-Image's arithmetic: the complex multiply on pairs (2i, 2i+1) with the
        frequencies' real / imaginary parts as half-width tables). Falls back to the original
        when autograd needs gradients, a q/k norm is not one the kernel reads, or the RoPE is
        not a complex (S, D/2) table for the query rows."""

        def __call__(self, attn, hidden_states, attention_mask=None, rotary_emb=None, **kwargs):
            D = attn.inner_dim // attn.heads
            ok = (
                common.norms_ok(attn.norm_q, attn.norm_k)
                and hidden_states.dim() == 3
                and not common.needs_grad(attn, hidden_states)
            )
            if ok and rotary_emb is not None:
                ok = (
                    isinstance(rotary_emb, torch.Tensor)
                    and rotary_emb.is_complex()
                    and rotary_emb.dim() == 2
                    and rotary_emb.shape == (hidden_states.shape[1], D // 2)
                )
            if not ok:
                return super().__call__(attn, hidden_states, attention_mask, rotary_emb, **kwargs)
            q = attn.to_q(hidden_states).unflatten(-1, (-1, D))
            k = attn.to_k(hidden_states).unflatten(-1, (-1, D))
            cos, sin = _cs(rotary_emb) if rotary_emb is not None else (None, None)
            rot = {"rotary_dim": D} if rotary_emb is not None else {}
            q, k = common.attn_qk_norm_rope(attn, q, k, cos, sin, **rot)
            # the processor's own code (KV cache, prefill segments, flex path) on the fused
            # Q / K, without its rotary table (the rotation is done)
            projected = common.Projected(attn, to_q=q.flatten(2), to_k=k.flatten(2))
            return super().__call__(projected, hidden_states, attention_mask, None, **kwargs)

    DitfuseQwenImage21AttnProcessor.__name__ = DitfuseQwenImage21AttnProcessor.__qualname__ = (
        "Ditfuse" + base.__name__
    )
    return DitfuseQwenImage21AttnProcessor


def _block_forward(
    self,
    hidden_states,
    encoder_hidden_states,
    encoder_hidden_states_mask,
    temb,
    image_rotary_emb=None,
    joint_attention_kwargs=None,
    modulate_index=None,
):
    """QwenImageTransformerBlock.forward with the AdaLN chains fused. Falls back to the
    block's own forward for ``modulate_index`` (the edit models' per-token choice of
    modulation), autograd, other norms, or dtypes that differ from the activations'."""
    from diffusers.models.transformers.transformer_qwenimage import QwenImageTransformerBlock

    x, c = hidden_states, encoder_hidden_states
    norms = (self.img_norm1, self.img_norm2, self.txt_norm1, self.txt_norm2)
    if modulate_index is not None or not (
        common.plain_layer_norms(*norms)
        and x.dim() == 3
        and c.dim() == 3
        and x.dtype == c.dtype == self.img_mod[1].weight.dtype == self.txt_mod[1].weight.dtype
        and not common.needs_grad(self, x, c, temb)
    ):
        return QwenImageTransformerBlock.forward(
            self,
            hidden_states,
            encoder_hidden_states,
            encoder_hidden_states_mask,
            temb,
            image_rotary_emb,
            joint_attention_kwargs,
            modulate_index,
        )
    img_mod_params = self.img_mod(temb)
    if self.zero_cond_t:
        temb = torch.chunk(temb, 2, dim=0)[0]
    txt_mod_params = self.txt_mod(temb)
    img_mod1, img_mod2 = img_mod_params.chunk(2, dim=-1)
    txt_mod1, txt_mod2 = txt_mod_params.chunk(2, dim=-1)

    def mods(p):  # (shift, scale, gate), each (B, D)
        return p.chunk(3, dim=-1)

    (i_sh1, i_sc1, i_g1), (i_sh2, i_sc2, i_g2) = mods(img_mod1), mods(img_mod2)
    (t_sh1, t_sc1, t_g1), (t_sh2, t_sc2, t_g2) = mods(txt_mod1), mods(txt_mod2)
    img_modulated = common.per_op_modulate(hidden_states, i_sh1, i_sc1, self.img_norm1)
    txt_modulated = common.per_op_modulate(encoder_hidden_states, t_sh1, t_sc1, self.txt_norm1)
    img_attn_output, txt_attn_output = self.attn(
        hidden_states=img_modulated,
        encoder_hidden_states=txt_modulated,
        encoder_hidden_states_mask=encoder_hidden_states_mask,
        image_rotary_emb=image_rotary_emb,
        **(joint_attention_kwargs or {}),
    )
    hidden_states = streams.per_op_mlp_tail(
        hidden_states, img_attn_output, i_g1, i_sh2, i_sc2, i_g2, self.img_norm2, self.img_mlp
    )
    encoder_hidden_states = streams.per_op_mlp_tail(
        encoder_hidden_states,
        txt_attn_output,
        t_g1,
        t_sh2,
        t_sc2,
        t_g2,
        self.txt_norm2,
        self.txt_mlp,
    )
    if encoder_hidden_states.dtype == torch.float16:
        encoder_hidden_states = encoder_hidden_states.clip(-65504, 65504)
    if hidden_states.dtype == torch.float16:
        hidden_states = hidden_states.clip(-65504, 65504)
    return encoder_hidden_states, hidden_states


def patch_model(model, report, *, qk_norm_rope=True, adaln=True, attention=True, activations=True):
    from diffusers.models.transformers.transformer_qwenimage import (
        QwenDoubleStreamAttnProcessor2_0,
        QwenImageTransformerBlock,
    )

    processors = {QwenDoubleStreamAttnProcessor2_0: _make_processor()} if qk_norm_rope else None
    forwards = {QwenImageTransformerBlock: (_block_forward, "blocks (AdaLN + gated residuals)")}
    common.replace_and_bind(model, report, attention, processors, forwards if adaln else None)


def patch_model_21(
    model, report, *, qk_norm_rope=True, adaln=True, attention=True, activations=True
):
    """Qwen-Image 2.1 (QwenImage21Transformer2DModel): the attention processors' QK-norm +
    RoPE (either processor class; the KV cache and the prefill's segments are the
    processor's own code). The blocks are left as they are."""
    from diffusers.models.transformers import transformer_qwenimage21 as t21

    if qk_norm_rope:
        common.replace_processors(
            model,
            report,
            {
                cls: _make_processor_21(cls)
                for cls in (t21.QwenImage21AttnProcessor, t21.QwenImage21FlexAttnProcessor)
            },
            common.QK_LABEL,
        )
