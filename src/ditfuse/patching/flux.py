"""FLUX.1 (FluxTransformer2DModel): per-head QK-norm + RoPE, AdaLayerNormZero(Single), the
blocks' gated residuals with the norm + modulation that follows them, and the single-stream
blocks' GELU written straight into the buffer ``proj_out`` reads (no ``torch.cat``). Chroma
(ChromaTransformer2DModel, FLUX.1's attention): the QK-norm + RoPE and its pruned
AdaLayerNormZero(Single) modules' norm + modulate."""

from __future__ import annotations

import torch

from ditfuse.ops.adaln import adaln_modulate
from ditfuse.patching import common, streams


def joint_processor(base, get_qkv_projections, out):
    """The fused subclass of a FLUX double-stream processor class ``base`` -- FLUX.1's
    ``FluxAttnProcessor``, FLUX.2's ``Flux2AttnProcessor``: the same code but for the output
    projections -- given its module's ``_get_qkv_projections`` and its output step ``out``
    (``out(attn, hidden_states, encoder_hidden_states)``, the text rows None in a
    single-stream call)."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    class DitfuseJointAttnProcessor(common.FusedProcessor, base):
        """A FLUX processor with the per-head QK-norm and the RoPE of each stream fused into
        one kernel; the text and image streams are written straight into their slices of the
        concatenated Q/K (no separate concat copy of Q and K).

        Falls back to the base processor's ``__call__`` when autograd needs gradients, when a
        q/k norm is not an RMSNorm (torch's or diffusers'), or when ``image_rotary_emb`` is
        not a (cos, sin) pair of (S_total, D) tables.

        With ``patch(attention="fp8")``: each stream's Q / K from its kernel as
        ``common.qk_8bit`` says, the streams concatenated (text first), and the
        attention on ``ditfuse.attention(..., precision="fp8")`` where the call allows it
        (:func:`joint_attention`); else the 16-bit path.
        """

        def fused_ok(self, attn, hidden_states, encoder_hidden_states, attention_mask, rope):
            joint = attn.added_kv_proj_dim is not None  # a text stream, which must be given
            return (not joint or encoder_hidden_states is not None) and qk_ok(
                attn, hidden_states, encoder_hidden_states, rope, joint
            )

        def fused(self, attn, hidden_states, encoder_hidden_states, attention_mask, rope):
            joint = attn.added_kv_proj_dim is not None and encoder_hidden_states is not None
            projections = get_qkv_projections(attn, hidden_states, encoder_hidden_states)
            hidden_states = joint_attention(
                self,
                attn,
                *projections,
                rope,
                joint,
                attention_mask,
                dispatch_attention_fn,
            )
            if encoder_hidden_states is None:
                return out(attn, hidden_states, None)
            T = encoder_hidden_states.shape[1]
            encoder_hidden_states, hidden_states = hidden_states.split_with_sizes(
                [T, hidden_states.shape[1] - T], dim=1
            )
            return out(attn, hidden_states, encoder_hidden_states)

    DitfuseJointAttnProcessor.__name__ = DitfuseJointAttnProcessor.__qualname__ = (
        "Ditfuse" + base.__name__
    )
    return DitfuseJointAttnProcessor


def _out(attn, hidden_states, encoder_hidden_states):
    """FluxAttnProcessor's output step: the image rows through ``to_out``, the text rows
    through ``to_add_out``; a single-stream call's attention output as it is."""
    if encoder_hidden_states is None:
        return hidden_states
    hidden_states = attn.to_out[0](hidden_states.contiguous())
    hidden_states = attn.to_out[1](hidden_states)
    return hidden_states, attn.to_add_out(encoder_hidden_states.contiguous())


def _make_processor():
    from diffusers.models.transformers import transformer_flux as tf

    return joint_processor(tf.FluxAttnProcessor, tf._get_qkv_projections, _out)


def _rows(cos, sin, a, b):
    if cos is None:
        return None, None
    return cos[a:b], sin[a:b]


def qk_ok(attn, hidden_states, encoder_hidden_states, image_rotary_emb, joint) -> bool:
    """Whether the fused Q/K path reproduces the processor: q/k norms qk_norm_rope reads, no
    gradients, a (cos, sin) pair of (S_total, D) tables (or no RoPE)."""
    total = hidden_states.shape[1] + (encoder_hidden_states.shape[1] if joint else 0)
    return (
        common.norms_ok(attn.norm_q, attn.norm_k)
        and (not joint or common.norms_ok(attn.norm_added_q, attn.norm_added_k))
        and not common.needs_grad(attn, hidden_states, encoder_hidden_states)
        and common.rope_pair_ok(image_rotary_emb, total)
    )


def joint_qk(
    attn, query, key, value, encoder_query, encoder_key, encoder_value, rope, joint, quantize=None
):
    """Per-head norm + RoPE of the (text +) image streams, as the FLUX processors do before
    attention: unflatten to heads, norm each stream with its own norms, concatenate text
    first, rotate the whole sequence -- each stream by one kernel call into its rows of the
    joint Q / K (:func:`~ditfuse.patching.common.joint_qk`). (query, key, value) as
    (B, S_total, H, D): ((query, key), value), or with ``quantize`` (``QuantizedQK``, value)."""
    D = attn.head_dim
    query, key, value = (t.unflatten(-1, (-1, D)) for t in (query, key, value))
    cos, sin = rope if rope is not None else (None, None)
    if not joint:
        qk = common.attn_qk_norm_rope(attn, query, key, cos, sin, quantize=quantize)
    else:
        encoder_query, encoder_key, encoder_value = (
            t.unflatten(-1, (-1, D)) for t in (encoder_query, encoder_key, encoder_value)
        )
        T, S = encoder_query.shape[1], query.shape[1]
        c_cos, c_sin = _rows(cos, sin, 0, T)
        i_cos, i_sin = _rows(cos, sin, T, T + S)
        qk = common.joint_qk(
            [
                common.qk_stream(
                    encoder_query,
                    encoder_key,
                    attn.norm_added_q,
                    attn.norm_added_k,
                    cos=c_cos,
                    sin=c_sin,
                ),
                common.qk_stream(query, key, attn.norm_q, attn.norm_k, cos=i_cos, sin=i_sin),
            ],
            quantize=quantize,
            like=1,
        )
        value = torch.cat([encoder_value, value], dim=1)
    return qk, value


def joint_attention(
    proc,
    attn,
    query,
    key,
    value,
    encoder_query,
    encoder_key,
    encoder_value,
    rope,
    joint,
    mask,
    dispatch_attention_fn,
):
    """The FLUX processors' attention from the projections to the (B, S_total, H*D) output:
    :func:`joint_qk` and the model's dispatch (16 bits), or with ``patch(attention="fp8")``
    where the call allows it (``common.use_8bit`` / ``common.attend``) each stream
    normalised and rotated by one kernel -- and, where ``common.qk_8bit`` says (Triton's
    interpreter), quantized (int8, per-token scales) by it -- the streams concatenated text
    first (their values and their scales), V as the processor
    concatenates it, and ``ditfuse.attention(..., precision="fp8")`` -- a key-padding
    ``mask`` (bool (B or 1, 1, 1, S_total), ``common.key_padding``) as its ``key_mask``."""
    enc = (encoder_query, encoder_key, encoder_value) if joint else ()

    def attend_16bit(query, key, value, *enc):
        (query, key), value = joint_qk(attn, query, key, value, *(enc or (None,) * 3), rope, joint)
        return common.sdpa(proc, dispatch_attention_fn, query, key, value, mask)

    def attend_8bit(query, key, value, *enc, key_mask=None):
        quantize = common.qk_8bit(key_mask)
        qk, value = joint_qk(
            attn, query, key, value, *(enc or (None,) * 3), rope, joint, quantize=quantize
        )
        return common.attention_8bit(qk, value, key_mask=key_mask).flatten(2, 3)

    eight = common.use_8bit(proc, query, value, attn.head_dim, mask, proc._parallel_config)
    n = query.shape[1] + (encoder_query.shape[1] if joint else 0)
    return common.attend(
        eight, mask, attend_8bit, attend_16bit, (query, key, value, *enc), keys=(query.shape[0], n)
    )


def _ada_ok(self, x, emb_dtype) -> bool:
    from diffusers.models.normalization import FP32LayerNorm

    n = self.norm
    return (
        isinstance(n, (torch.nn.LayerNorm, FP32LayerNorm))
        and n.weight is None
        and n.bias is None
        and emb_dtype == x.dtype
        and x.dim() == 3
        and not common.needs_grad(self, x)
    )


def _modulate(self, x, shift, scale, emb_dtype):
    """``self.norm(x) * (1 + scale) + shift`` of an AdaLayerNormZero-like module, fused where
    :func:`_ada_ok` holds (per-op rounding, as the module computes in the activation dtype)."""
    if _ada_ok(self, x, emb_dtype):
        return adaln_modulate(x, shift, scale, norm="layer", eps=self.norm.eps, rounding="per_op")
    return self.norm(x) * (1 + scale[:, None]) + shift[:, None]


def _ada_zero_forward(self, x, timestep=None, class_labels=None, hidden_dtype=None, emb=None):
    """AdaLayerNormZero.forward with norm + modulate fused; rounding per op, as the module
    computes in the activation dtype (bitwise for most elements)."""
    if self.emb is not None:
        emb = self.emb(timestep, class_labels, hidden_dtype=hidden_dtype)
    emb = self.linear(self.silu(emb))
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = emb.chunk(6, dim=1)
    x = _modulate(self, x, shift_msa, scale_msa, emb.dtype)
    return x, gate_msa, shift_mlp, scale_mlp, gate_mlp


def _ada_zero_single_forward(self, x, emb=None):
    emb = self.linear(self.silu(emb))
    shift_msa, scale_msa, gate_msa = emb.chunk(3, dim=1)
    x = _modulate(self, x, shift_msa, scale_msa, emb.dtype)
    return x, gate_msa


def _chroma_zero_forward(self, x, timestep=None, class_labels=None, hidden_dtype=None, emb=None):
    """Chroma's ChromaAdaLayerNormZeroPruned.forward (the modulation sliced from the
    approximator's output instead of a linear) with norm + modulate fused, as
    :func:`_ada_zero_forward`."""
    if self.emb is not None:
        emb = self.emb(timestep, class_labels, hidden_dtype=hidden_dtype)
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = emb.flatten(1, 2).chunk(
        6, dim=1
    )
    x = _modulate(self, x, shift_msa, scale_msa, emb.dtype)
    return x, gate_msa, shift_mlp, scale_mlp, gate_mlp


def _chroma_zero_single_forward(self, x, emb=None):
    shift_msa, scale_msa, gate_msa = emb.flatten(1, 2).chunk(3, dim=1)
    x = _modulate(self, x, shift_msa, scale_msa, emb.dtype)
    return x, gate_msa


def _chroma_norms():
    """Chroma's pruned AdaLN-Zero modules -> fused forwards ({} without Chroma)."""
    try:
        from diffusers.models.transformers import transformer_chroma as tc
    except ImportError:
        return {}
    return {
        tc.ChromaAdaLayerNormZeroPruned: (
            _chroma_zero_forward,
            "Chroma AdaLayerNormZeroPruned (modulate)",
        ),
        tc.ChromaAdaLayerNormZeroSinglePruned: (
            _chroma_zero_single_forward,
            "Chroma AdaLayerNormZeroSinglePruned (modulate)",
        ),
    }


def _flux_block_arguments(fused):
    """A FLUX.1 block forward -- FluxTransformerBlock's and FluxSingleTransformerBlock's take
    the same arguments -- as ``fused(self, hidden_states, encoder_hidden_states, temb,
    attention_kwargs, **options)``, ``attention_kwargs`` the keywords the block passes its
    attention module: the RoPE and the ``joint_attention_kwargs``."""

    def forward(
        self,
        hidden_states,
        encoder_hidden_states,
        temb,
        image_rotary_emb=None,
        joint_attention_kwargs=None,
        **options,
    ):
        attention_kwargs = dict(image_rotary_emb=image_rotary_emb, **(joint_attention_kwargs or {}))
        return fused(self, hidden_states, encoder_hidden_states, temb, attention_kwargs, **options)

    forward.__name__, forward.__doc__ = fused.__name__, fused.__doc__
    return forward


@common.fused_if(common.double_block_ok)
@_flux_block_arguments
def _block_forward(self, hidden_states, encoder_hidden_states, temb, attention_kwargs):
    """FluxTransformerBlock.forward with, per stream, ``x + gate * attn`` -> norm2 ->
    ``* (1 + scale) + shift`` as one kernel and ``x + gate * ff`` as another (the eager
    block's bf16 per-op rounding: ``rounding="per_op"``), where ``common.double_block_ok``
    holds (no autograd, the norms and dtypes it reproduces)."""
    norm_hidden_states, *mods = self.norm1(hidden_states, emb=temb)
    norm_encoder_hidden_states, *c_mods = self.norm1_context(encoder_hidden_states, emb=temb)
    attention_outputs = self.attn(
        hidden_states=norm_hidden_states,
        encoder_hidden_states=norm_encoder_hidden_states,
        **attention_kwargs,
    )
    hidden_states, encoder_hidden_states = streams.mlp_tails(
        self, hidden_states, encoder_hidden_states, *attention_outputs[:2], mods, c_mods, True
    )
    if len(attention_outputs) == 3:  # IP-adapter output, added as the block does
        hidden_states = hidden_states + attention_outputs[2]
    return encoder_hidden_states, hidden_states


@_flux_block_arguments
def _single_block(self, hidden_states, encoder_hidden_states, temb, attention_kwargs, *, fuse_act):
    """FluxSingleTransformerBlock.forward as ``streams.single_block`` (text rows first):
    ``residual + gate * proj_out(...)`` as one kernel (per-op rounding, as the block computes
    it in the activation dtype) and, with ``fuse_act``, ``act_mlp`` (an ``nn.GELU``) written
    into the MLP half of the concat buffer (the same values as ``torch.cat([attn,
    act_mlp(mlp)], dim=2)``); the block's own forward where ``common.single_block_ok``
    fails."""

    def attend(norm_hidden_states):
        return self.attn(hidden_states=norm_hidden_states, **attention_kwargs)

    T = encoder_hidden_states.shape[1]
    out = streams.single_block(self, (encoder_hidden_states, hidden_states), temb, attend, fuse_act)
    if out.dtype == torch.float16:
        out = out.clip(-65504, 65504)
    return out[:, :T], out[:, T:]


_single_block_forward = common.fused_if(common.single_block_ok, fuse_act=False)(_single_block)
_single_block_forward_act = common.fused_if(common.single_block_ok, fuse_act=True)(_single_block)


def zero_block_forwards(block, single_block, activations: bool) -> dict:
    """The :func:`~ditfuse.patching.common.bind_forwards` table of FLUX.1's block layout,
    which HunyuanVideo shares: AdaLayerNormZero(Single)'s norm + modulate, ``block`` (class,
    forward) and ``single_block`` (class, forward, forward with the GELU written into the
    concat buffer: with ``activations``)."""
    from diffusers.models.normalization import AdaLayerNormZero, AdaLayerNormZeroSingle

    (block_cls, block_fwd), (single_cls, single_fwd, single_act_fwd) = block, single_block
    single = (
        (single_act_fwd, "single blocks (gated residual, GELU into the concat buffer)")
        if activations
        else (single_fwd, "single blocks (gated residual)")
    )
    return {
        AdaLayerNormZero: (_ada_zero_forward, "AdaLayerNormZero (modulate)"),
        AdaLayerNormZeroSingle: (_ada_zero_single_forward, "AdaLayerNormZeroSingle (modulate)"),
        block_cls: (block_fwd, "blocks (gated residuals + norm2)"),
        single_cls: single,
    }


def patch_model(model, report, *, qk_norm_rope=True, adaln=True, attention=True, activations=True):
    from diffusers.models.transformers.transformer_flux import (
        FluxAttention,
        FluxAttnProcessor,
        FluxSingleTransformerBlock,
        FluxTransformerBlock,
    )

    fp8 = attention == common.FP8
    proc = common.processor_factory(_make_processor(), fp8) if qk_norm_rope else None
    for m in model.modules():
        if (
            proc is not None
            and isinstance(m, FluxAttention)
            and common.original_processor_type(m) is FluxAttnProcessor
        ):
            if common.set_processor(m, proc()):
                report.add(common.fp8_report_label(common.fp8_label(common.QK_LABEL, fp8), m))
    if adaln:
        common.bind_forwards(
            model,
            report,
            {
                **_chroma_norms(),
                **zero_block_forwards(
                    (FluxTransformerBlock, _block_forward),
                    (FluxSingleTransformerBlock, _single_block_forward, _single_block_forward_act),
                    activations,
                ),
            },
        )
