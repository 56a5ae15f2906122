"""HunyuanVideo (HunyuanVideoTransformer3DModel) and HunyuanVideo 1.5
(HunyuanVideo15Transformer3DModel: dual-stream blocks only, its own processor): per-head
QK-norm + RoPE on the image tokens, QK-norm only on the text tokens -- from the projections
into fresh Q / K in the single-stream blocks, into the rows of the joint Q / K in the
dual-stream ones (no ``torch.cat`` of Q and K); in the double- and single-stream blocks,
AdaLayerNormZero(Single)'s norm + modulate and the gated residuals (with the norm2 +
modulate that follows) as the AdaLN kernels; the single-stream blocks' GELU written
straight into the buffer ``proj_out`` reads, next to the image and text attention outputs
(both ``torch.cat`` copies of the block gone)."""

from __future__ import annotations

import torch

from ditfuse.patching import common, streams
from ditfuse.patching.flux import _ada_zero_forward, zero_block_forwards


def _heads(attn, x, *projections):
    """``x`` through each projection, as (B, S, H, D)."""
    return tuple(proj(x).unflatten(2, (attn.heads, -1)) for proj in projections)


def _dual_streams(attn, cos, sin, query, key, encoder_query, encoder_key):
    """A dual-stream block's streams for :func:`~ditfuse.patching.common.joint_qk`, image
    first: the image's Q / K normalised and rotated, the text's normalised."""
    return [
        common.qk_stream(query, key, attn.norm_q, attn.norm_k, cos=cos, sin=sin),
        common.qk_stream(encoder_query, encoder_key, attn.norm_added_q, attn.norm_added_k),
    ]


def _dual_qkv(attn, cos, sin, query, key, value, encoder_query, encoder_key, encoder_value):
    """The joint (image then text) Q / K / V of a dual-stream block, each stream's Q / K
    straight into its rows (:func:`~ditfuse.patching.common.joint_qk`)."""
    q_all, k_all = common.joint_qk(
        _dual_streams(attn, cos, sin, query, key, encoder_query, encoder_key)
    )
    return q_all, k_all, torch.cat([value, encoder_value], dim=1)


def _dual_8bit(
    attn, cos, sin, query, key, value, encoder_query, encoder_key, encoder_value, key_mask=None
):
    """A dual-stream block's attention on 8 bits: each stream's Q / K normalised (the image's
    also rotated) by one kernel -- and, as ``common.qk_8bit`` says, quantized to int8 with
    per-token scales by it -- concatenated image first (values and scales), V as
    :func:`_dual_qkv` concatenates it."""
    qk = common.joint_qk(
        _dual_streams(attn, cos, sin, query, key, encoder_query, encoder_key),
        quantize=common.qk_8bit(key_mask),
    )
    return common.attention_8bit(
        qk, torch.cat([value, encoder_value], dim=1), key_mask=key_mask
    ).flatten(2, 3)


def _single_qk(attn, cos, sin, query, key, n_img, text=None, quantize=None):
    """Q / K of a single-stream block's sequence, image rows (``n_img``) then the ``text``
    rows (a slice; None: no text), one kernel each into fresh Q / K (rather than in place:
    the same bits, faster: docs/design/qk_norm_rope.md): the image rows normalised and
    rotated, the text rows normalised. With ``quantize`` their ``QuantizedQK``."""
    img = slice(0, n_img)
    norms = (attn.norm_q, attn.norm_k)
    streams = [common.qk_stream(query[:, img], key[:, img], *norms, cos=cos, sin=sin)]
    if text is not None:
        streams.append(common.qk_stream(query[:, text], key[:, text], *norms))
    return common.joint_qk(streams, quantize=quantize)


def _split_out(attn, hidden_states, T):
    """The attention output's image and text rows through their output projections (the
    last ``T`` rows are the text's)."""
    hidden_states, encoder_hidden_states = hidden_states[:, :-T], hidden_states[:, -T:]
    if getattr(attn, "to_out", None) is not None:
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
    if getattr(attn, "to_add_out", None) is not None:
        encoder_hidden_states = attn.to_add_out(encoder_hidden_states)
    return hidden_states, encoder_hidden_states


def _make_processor():
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.transformers import transformer_hunyuan_video as th

    class DitfuseHunyuanVideoAttnProcessor(common.FusedProcessor, th.HunyuanVideoAttnProcessor2_0):
        """HunyuanVideoAttnProcessor2_0 with QK-norm + RoPE fused: image tokens are normalised
        and rotated by one kernel, text tokens normalised by one kernel -- into fresh Q / K in
        the single-stream blocks; in the dual-stream blocks each stream is written into its rows
        of the joint Q / K, which replaces the processor's ``torch.cat`` of Q and K (same
        values).

        Falls back to the original when autograd needs gradients, a q/k norm is not an
        RMSNorm/LayerNorm, or the RoPE is not a (cos, sin) pair of (S_image, D) tables.

        With ``patch(attention="fp8")``: each stream's (the single-stream blocks: each token
        range's) Q / K from its kernel as ``common.qk_8bit`` says (16-bit on a GPU, int8 with
        per-token scales under the interpreter), the streams concatenated image first, and the
        attention on ``ditfuse.attention(..., precision="fp8")`` where the call allows it
        (``common.use_8bit``, ``common.attend``): the model's joint mask, bool (B, 1, 1, N),
        is a key-padding mask -- the padded prompt tokens go to the kernel as its
        ``key_mask``; another mask 8-bit only where it masks nothing.
        """

        def fused_ok(self, attn, hidden_states, encoder_hidden_states, attention_mask, rope):
            norms = (attn.norm_q, attn.norm_k)
            norms += (getattr(attn, "norm_added_q", None), getattr(attn, "norm_added_k", None))
            return (
                common.norms_ok(*norms)
                and not common.needs_grad(attn, hidden_states, encoder_hidden_states)
                and common.rope_pair_ok(rope, hidden_states.shape[1])
            )

        def fused(self, attn, hidden_states, encoder_hidden_states, attention_mask, rope):
            single = attn.add_q_proj is None and encoder_hidden_states is not None
            T = encoder_hidden_states.shape[1] if encoder_hidden_states is not None else 0
            n_img = hidden_states.shape[1]
            if single:
                hidden_states = torch.cat([hidden_states, encoder_hidden_states], dim=1)
            operands = _heads(attn, hidden_states, attn.to_q, attn.to_k, attn.to_v)
            if attn.add_q_proj is not None and encoder_hidden_states is not None:
                operands += _heads(
                    attn, encoder_hidden_states, attn.add_q_proj, attn.add_k_proj, attn.add_v_proj
                )
            cos, sin = rope if rope is not None else (None, None)
            text = slice(n_img, n_img + T) if single else None

            def attend_16bit(query, key, value, *enc):
                if enc:  # dual stream
                    query, key, value = _dual_qkv(attn, cos, sin, query, key, value, *enc)
                else:
                    query, key = _single_qk(attn, cos, sin, query, key, n_img, text)
                return common.sdpa(self, dispatch_attention_fn, query, key, value, attention_mask)

            def attend_8bit(query, key, value, *enc, key_mask=None):
                if enc:
                    return _dual_8bit(attn, cos, sin, query, key, value, *enc, key_mask=key_mask)
                quantize = common.qk_8bit(key_mask)
                qk = _single_qk(attn, cos, sin, query, key, n_img, text, quantize=quantize)
                return common.attention_8bit(qk, value, key_mask=key_mask).flatten(2, 3)

            query, value = operands[0], operands[2]
            eight = common.use_8bit(
                self, query, value, value.shape[-1], attention_mask, self._parallel_config
            )
            hidden_states = common.attend(
                eight,
                attention_mask,
                attend_8bit,
                attend_16bit,
                operands,
                keys=(query.shape[0], n_img + T),
            )
            if encoder_hidden_states is not None:
                hidden_states, encoder_hidden_states = _split_out(attn, hidden_states, T)
            return hidden_states, encoder_hidden_states

    return DitfuseHunyuanVideoAttnProcessor


def _make_processor_15():
    """The fused subclass of HunyuanVideo 1.5's processor (dual-stream blocks only)."""
    import torch.nn.functional as F
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    from diffusers.models.transformers import transformer_hunyuan_video15 as th

    class DitfuseHunyuanVideo15AttnProcessor(
        common.FusedProcessor, th.HunyuanVideo15AttnProcessor2_0
    ):
        """HunyuanVideo15AttnProcessor2_0 with QK-norm + RoPE fused as in HunyuanVideo's
        dual-stream blocks: the image tokens' Q / K normalised and rotated by one kernel, the
        text tokens' normalised by another, each straight into its rows of the joint Q / K
        the attention reads (the eager processor normalises, rotates, then concatenates:
        more passes over Q and K; same values). The joint mask is built as the eager
        processor builds it.

        Falls back to the original when autograd needs gradients, a q/k norm is not one
        ``qk_norm_rope`` reads exactly, there is no text stream or mask, or the RoPE is not
        a (cos, sin) pair of (S_image, D) tables.

        With ``patch(attention="fp8")``: as HunyuanVideo's processor, the token mask (padded
        with True for the image tokens) the kernel's ``key_mask``. The eager joint mask also
        drops the padded text tokens' own queries (rows all False: what SDPA writes there is
        its own); the kernel attends them over the kept keys. Nothing reads those rows: as
        keys those tokens stay masked in every block, and the model's output is the image
        tokens'.
        """

        def fused_ok(self, attn, hidden_states, encoder_hidden_states, attention_mask, rope):
            return (
                encoder_hidden_states is not None
                and attention_mask is not None
                and common.norms_ok(attn.norm_q, attn.norm_k, attn.norm_added_q, attn.norm_added_k)
                and not common.needs_grad(attn, hidden_states, encoder_hidden_states)
                and common.rope_pair_ok(rope, hidden_states.shape[1])
            )

        def fused(self, attn, hidden_states, encoder_hidden_states, attention_mask, rope):
            S = hidden_states.shape[1]
            operands = _heads(attn, hidden_states, attn.to_q, attn.to_k, attn.to_v) + _heads(
                attn, encoder_hidden_states, attn.add_q_proj, attn.add_k_proj, attn.add_v_proj
            )
            B, T = hidden_states.shape[0], encoder_hidden_states.shape[1]
            cos, sin = rope if rope is not None else (None, None)
            # the eager processor's joint mask: the token mask left-padded with True to the
            # joint length, a pair kept where both tokens are
            n = S + T
            tokens = F.pad(attention_mask, (n - attention_mask.shape[1], 0), value=True).bool()

            def attend_16bit(*operands):
                query, key, value = _dual_qkv(attn, cos, sin, *operands)
                rows = tokens.view(B, 1, 1, n).repeat(1, 1, n, 1)
                return common.sdpa(
                    self, dispatch_attention_fn, query, key, value, rows & rows.transpose(2, 3)
                )

            def attend_8bit(*operands, key_mask=None):
                return _dual_8bit(attn, cos, sin, *operands, key_mask=key_mask)

            value = operands[2]
            eight = common.use_8bit(
                self, operands[0], value, value.shape[-1], tokens, self._parallel_config
            )
            hidden_states = common.attend(
                eight, tokens.view(B, 1, 1, n), attend_8bit, attend_16bit, operands, keys=(B, n)
            )
            return _split_out(attn, hidden_states, T)

    return DitfuseHunyuanVideo15AttnProcessor


@common.fused_if(common.double_block_ok)
def _block_forward(
    self,
    hidden_states,
    encoder_hidden_states,
    temb,
    attention_mask=None,
    freqs_cis=None,
    *args,
    **kwargs,
):
    """HunyuanVideoTransformerBlock.forward (HunyuanVideo15TransformerBlock's is the same
    code) with, per stream, ``x + attn * gate`` -> norm2 -> ``* (1 + scale) + shift`` as one
    kernel and ``x + gate * ff`` as another (per-op rounding, as the block computes in the
    activation dtype), where ``common.double_block_ok`` holds (no autograd, the norms and
    dtypes it reproduces)."""
    norm_hidden_states, *mods = self.norm1(hidden_states, emb=temb)
    norm_encoder_hidden_states, *c_mods = self.norm1_context(encoder_hidden_states, emb=temb)
    attn_output, context_attn_output = self.attn(
        hidden_states=norm_hidden_states,
        encoder_hidden_states=norm_encoder_hidden_states,
        attention_mask=attention_mask,
        image_rotary_emb=freqs_cis,
    )
    return streams.mlp_tails(
        self, hidden_states, encoder_hidden_states, attn_output, context_attn_output, mods, c_mods
    )


def _single_block(
    self,
    hidden_states,
    encoder_hidden_states,
    temb,
    attention_mask=None,
    image_rotary_emb=None,
    *args,
    fuse_act,
    **kwargs,
):
    """HunyuanVideoSingleTransformerBlock.forward as ``streams.single_block`` (image rows
    first): ``gate * proj_out(...) + residual`` as one kernel (per-op rounding) and, with
    ``fuse_act``, the GELU and both concatenations as one buffer (``common.gelu_into_buffer``);
    the block's own forward where ``common.single_block_ok`` fails."""
    T = encoder_hidden_states.shape[1]

    def attend(norm_hidden_states):  # the image rows, then the text rows
        return self.attn(
            hidden_states=norm_hidden_states[:, :-T, :],
            encoder_hidden_states=norm_hidden_states[:, -T:, :],
            attention_mask=attention_mask,
            image_rotary_emb=image_rotary_emb,
        )

    out = streams.single_block(self, (hidden_states, encoder_hidden_states), temb, attend, fuse_act)
    return out[:, :-T, :], out[:, -T:, :]


_single_block_forward = common.fused_if(common.single_block_ok, fuse_act=False)(_single_block)
_single_block_forward_act = common.fused_if(common.single_block_ok, fuse_act=True)(_single_block)


def patch_model(model, report, *, qk_norm_rope=True, adaln=True, attention=True, activations=True):
    from diffusers.models.transformers import transformer_hunyuan_video as th

    processors = {th.HunyuanVideoAttnProcessor2_0: _make_processor()} if qk_norm_rope else None
    blocks = (
        (th.HunyuanVideoTransformerBlock, _block_forward),
        (th.HunyuanVideoSingleTransformerBlock, _single_block_forward, _single_block_forward_act),
    )
    forwards = zero_block_forwards(*blocks, activations) if adaln else None
    common.replace_and_bind(model, report, attention, processors, forwards)


def patch_model_15(
    model, report, *, qk_norm_rope=True, adaln=True, attention=True, activations=True
):
    """HunyuanVideo 1.5 (HunyuanVideo15Transformer3DModel): dual-stream blocks only, whose
    forward is HunyuanVideo's; its own attention processor (the joint mask built inside)."""
    from diffusers.models.normalization import AdaLayerNormZero
    from diffusers.models.transformers import transformer_hunyuan_video15 as th

    processors = {th.HunyuanVideo15AttnProcessor2_0: _make_processor_15()} if qk_norm_rope else None
    forwards = {
        AdaLayerNormZero: (_ada_zero_forward, "AdaLayerNormZero (modulate)"),
        th.HunyuanVideo15TransformerBlock: (_block_forward, "blocks (gated residuals + norm2)"),
    }
    common.replace_and_bind(model, report, attention, processors, forwards if adaln else None)
