"""Wan 2.x (WanTransformer3DModel: T2V, I2V with ``norm_added_k``, TI2V per-token temb),
Wan 2.2 Animate (WanAnimateTransformer3DModel: Wan's attention and blocks as copies in its
own module, around its face adapter), ChronoEdit (the same copies, its own RoPE rows), and
SkyReels-V2 (the same architecture in its own
classes; diffusion forcing's per-frame temb and block-causal mask)."""

from __future__ import annotations

import torch

from ditfuse.ops.adaln import adaln_modulate, gated_residual_adaln
from ditfuse.ops.linear_fp8 import Rows8
from ditfuse.ops.qk_norm_rope import QuantizedQK, qk_norm_rope
from ditfuse.patching import common
from ditfuse.patching.linear_fp8 import ffn_residual, ffn_takes_rows8, is_fp8, unhooked


def _wan_cos(t):
    return t[..., 0::2].contiguous()


def _wan_sin(t):
    return t[..., 1::2].contiguous()


def _qk(x, norm, H, cos=None, sin=None, k=None, k_norm=None, quantize=None):
    """Norm (+ Wan's RoPE) of q (and k) as (B, S, H*D), into fresh tensors (as Wan's own
    processor: ``norm_q`` and ``apply_rotary_emb`` return new ones; out of place is also the
    faster form: docs/design/qk_norm_rope.md); with ``quantize``, their 8-bit values and
    per-token scales (``QuantizedQK``, written by the same kernel)."""
    if (
        quantize is None
        and cos is None
        and isinstance(norm, torch.nn.Identity)
        and (k is None or isinstance(k_norm, torch.nn.Identity))
    ):
        return x, k
    D = x.shape[-1] // H
    if cos is not None:
        # Wan rotates with cos[..., 0::2] and sin[..., 1::2] for both channels of a pair:
        # exactly those columns as half-width tables (one value a pair, so any table gives
        # Wan's arithmetic, repeat-interleaved or not), packed once per table, which the
        # kernel reads in one load a pair (docs/design/qk_norm_rope.md)
        cos = common.table_once(cos, "wan-cos", _wan_cos)
        sin = common.table_once(sin, "wan-sin", _wan_sin)
    return qk_norm_rope(
        x,
        k,
        cos,
        sin,
        q_norm=norm,
        k_norm=k_norm,
        num_heads=H,
        rotary_dim=D if cos is not None else None,
        quantize=quantize,
    )


def _heads8(r: QuantizedQK, H: int) -> QuantizedQK:
    """(B, S, H*D) quantized Q / K as (B, S, H, D) views (the scales are (B, H, S) already)."""
    k = None if r.k is None else r.k.unflatten(2, (H, -1))
    return QuantizedQK(r.q.unflatten(2, (H, -1)), k, r.q_scale, r.k_scale)


def norm_rope(attn, query, key, rotary_emb=None, quantize=None):
    """A Wan processor's ``norm_q`` / ``norm_k`` (across heads) of the (B, S, H*D)
    projections and, with ``rotary_emb`` (Wan's (cos, sin) pair), the rotation of both: one
    kernel for Q and K where they have one shape, else one each (K not rotated: cross-
    attention). (query, key), or with ``quantize`` one ``QuantizedQK``."""
    H = attn.heads
    if rotary_emb is not None and query.shape == key.shape:
        return _qk(query, attn.norm_q, H, *rotary_emb, k=key, k_norm=attn.norm_k, quantize=quantize)
    q = _qk(query, attn.norm_q, H, *(rotary_emb or (None, None)), quantize=quantize)
    k = _qk(key, attn.norm_k, H, quantize=quantize)
    return (q[0], k[0]) if quantize is None else QuantizedQK(q.q, k.q, q.q_scale, k.q_scale)


def out_rows8_ok(attn, value) -> bool:
    """Whether attention ``attn``'s output may reach its output projection as e4m3 rows
    (``ditfuse.attention(..., quantize_out="fp8")``): that projection is an FP8 linear of
    V's dtype (with no hook on it)."""
    proj = attn.to_out[0]
    return is_fp8(proj) and proj.weight.dtype == value.dtype


def attention_8bit_i2v(attn, qk, value, image=(), quantize_out=None):
    """Wan's attention on 8 bits from (B, S, H*D) Q / K as :func:`norm_rope` wrote them for
    ``common.qk_8bit`` (a ``QuantizedQK``, or a 16-bit pair) and 16-bit V: the text (or
    self-attention) keys, plus with ``image`` (its key and value projections: I2V) the image
    keys -- ``norm_added_k`` by the kernel, in Q / K's form -- attended with the same Q.
    (B, S, H*D) in V's dtype; without ``image``, ``quantize_out="fp8"`` asks for the
    output as e4m3 rows (a ``Rows8``, where the call runs on 8 bits)."""
    H = attn.heads

    def heads(t):
        return t.unflatten(2, (H, -1))

    quantized = isinstance(qk, QuantizedQK)
    qk = _heads8(qk, H) if quantized else tuple(map(heads, qk))
    if quantize_out is not None and not image:
        out = common.attention_8bit(qk, heads(value), quantize_out=quantize_out)
        return out if isinstance(out, Rows8) else out.flatten(2, 3)
    out = common.attention_8bit(qk, heads(value)).flatten(2, 3)
    if image:
        key_img, value_img = image
        if quantized:
            k_img = _heads8(_qk(key_img, attn.norm_added_k, H, quantize="int8"), H)
            k, k_scale = k_img.q, k_img.q_scale
        else:
            k, k_scale = heads(_qk(key_img, attn.norm_added_k, H)[0]), None
        out = out + common.attention_8bit(qk, heads(value_img), k=k, k_scale=k_scale).flatten(2, 3)
    return out


def projected(attn, query, key, value, image=(), rotary_emb=None):
    """``attn`` as its processor sees it (:class:`~ditfuse.patching.common.Projected`) with Q /
    K normalised (and rotated) by :func:`norm_rope` and, with ``image`` (I2V: its key and
    value projections), the image keys by ``norm_added_k``; the processor is then called
    without its rotary table, and the output projection is left to the caller."""
    query, key = norm_rope(attn, query, key, rotary_emb)
    if not image:
        return common.Projected(attn, out=False, to_q=query, to_k=key, to_v=value)
    key_img, _ = _qk(image[0], attn.norm_added_k, attn.heads)
    return common.Projected(
        attn, out=False, to_q=query, to_k=key, to_v=value, add_k_proj=key_img, add_v_proj=image[1]
    )


def _make_processor(tw=None, base=None, skyreels: bool = False):
    """The fused subclass of processor class ``base`` of module ``tw`` (default Wan's
    ``WanAttnProcessor``; Wan Animate's or ChronoEdit's copy of it, or SkyReels-V2's,
    ``skyreels``; ``tw`` gives the module's own projection helpers). The 16-bit path runs
    the base processor's own code on the fused Q / K (:func:`projected`), so its attention
    calls keep their context-parallel config, which SkyReels passes to every attention call
    and Wan only to self-attention (diffusers PR 12909); the 8-bit path decides on the same
    config (``skyreels``)."""
    if tw is None:
        from diffusers.models.transformers import transformer_wan as tw

        base = tw.WanAttnProcessor

    class DitfuseWanAttnProcessor(common.FusedProcessor, base):
        #: its self-attention input reaches only the Q / K / V projections (here and in the
        #: base processor): an FP8 model's block may hand it quantized (``rows8_ok``)
        _rows8_input = not skyreels

        """WanAttnProcessor (or a copy of it, or SkyReelsV2AttnProcessor) with QK-norm
        (across heads) + RoPE fused into one kernel, and the I2V ``norm_added_k`` through the
        same kernel.

        Falls back to the base processor's ``__call__`` when autograd needs gradients, when a
        q/k norm is not ``torch.nn.RMSNorm`` / ``Identity``, or when ``rotary_emb`` is not a
        (cos, sin) pair of (1, S, 1, D) tables.

        The eager processor's arithmetic when the RoPE tables are fp32 (as
        ``from_pretrained`` keeps them, ``_keep_in_fp32_modules``), up to the order in which
        the norm's fp32 statistic is summed (within one rounding; bitwise at the tiny models:
        docs/design/end_to_end.md); a model cast whole with ``.to(bfloat16)`` has bf16
        tables, where eager Wan rounds every RoPE product in bf16 and the kernel rounds once
        (within a rounding).

        With ``patch(attention="fp8")`` self-, cross- and I2V image attention run on
        ``ditfuse.attention(..., precision="fp8")`` where ``common.use_8bit`` holds (head_dim
        64 / 128, a 16-bit model, no context-parallel exchange in the call, a device the
        kernel runs on) and the mask masks nothing (``common.attend``), Q / K from the same
        kernel in 16 bits or, under Triton's interpreter, int8 with per-token scales
        (``common.qk_8bit``); else the 16-bit path.
        """

        def __call__(
            self,
            attn,
            hidden_states,
            encoder_hidden_states=None,
            attention_mask=None,
            rotary_emb=None,
        ):  # the base's parameter names: a keyword caller of WanAttnProcessor is served too
            args = (hidden_states, encoder_hidden_states, attention_mask, rotary_emb)
            return common.FusedProcessor.__call__(self, attn, *args)

        def fused_ok(self, attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb):
            return (
                common.norms_ok(attn.norm_q, attn.norm_k)
                and (attn.add_k_proj is None or common.norms_ok(attn.norm_added_k))
                and not common.needs_grad(attn, hidden_states, encoder_hidden_states)
                and (
                    rotary_emb is None
                    or (
                        isinstance(rotary_emb, (tuple, list))
                        and len(rotary_emb) == 2
                        and rotary_emb[0].dim() == 4
                        and rotary_emb[0].shape[2] == 1
                    )
                )
            )

        def fused(self, attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb):
            context, image = encoder_hidden_states, None
            if attn.add_k_proj is not None:  # I2V: the image tokens, then 512 text tokens
                n = encoder_hidden_states.shape[1] - 512
                image, context = encoder_hidden_states[:, :n], encoder_hidden_states[:, n:]
            query, key, value = tw._get_qkv_projections(attn, hidden_states, context)
            img = () if image is None else tw._get_added_kv_projections(attn, image)
            parallel = self._parallel_config if skyreels or context is None else None
            eight = (
                common.use_8bit(
                    self, query, value, value.shape[-1] // attn.heads, attention_mask, parallel
                )
                and key.shape[1] > 0
                and (
                    not img
                    or (img[0].shape[1] > 0 and (not skyreels or self._parallel_config is None))
                )
            )

            def attend_16bit(query, key, value, *img):
                view = projected(attn, query, key, value, img, rotary_emb)
                return base.__call__(
                    self, view, hidden_states, encoder_hidden_states, attention_mask
                )

            # the output projection may take the kernel's e4m3 rows where no mask can send
            # the call through torch.cond (whose branches return one tensor)
            rows8 = eight and attention_mask is None and not img and out_rows8_ok(attn, value)

            def attend_8bit(query, key, value, *img):
                qk = norm_rope(attn, query, key, rotary_emb, quantize=common.qk_8bit())
                return attention_8bit_i2v(
                    attn, qk, value, img, quantize_out="fp8" if rows8 else None
                )

            hidden_states = common.attend(
                eight, attention_mask, attend_8bit, attend_16bit, (query, key, value, *img)
            )
            hidden_states = attn.to_out[0](hidden_states)
            hidden_states = attn.to_out[1](hidden_states)
            return hidden_states

    if skyreels:
        DitfuseWanAttnProcessor.__name__ = DitfuseWanAttnProcessor.__qualname__ = (
            "DitfuseSkyReelsV2AttnProcessor"
        )
    return DitfuseWanAttnProcessor


def _block_forward(self, hidden_states, encoder_hidden_states, temb, rotary_emb):
    """WanTransformerBlock.forward with the three AdaLN chains fused (same arithmetic: fp32
    math, the model's casts): norm1 + modulate; gated residual + norm2; residual + norm3 +
    modulate; the FFN's gated residual (which feeds the next block) alone."""
    if common.needs_grad(self, hidden_states, temb) or not _block_ok(self):
        # the class's own forward (bound on exact WanTransformerBlock types: Wan's, or Wan
        # Animate's copy of it)
        return type(self).forward(self, hidden_states, encoder_hidden_states, temb, rotary_emb)
    if temb.ndim == 4:  # (B, S, 6, D): Wan 2.2 TI2V, per-token modulation
        mods = (self.scale_shift_table.unsqueeze(0) + temb.float()).chunk(6, dim=2)
        mods = [m.squeeze(2) for m in mods]
    else:
        mods = (self.scale_shift_table + temb.float()).chunk(6, dim=1)
    return _chain(self, hidden_states, encoder_hidden_states, mods, rotary_emb, None)


def _skyreels_block_forward(
    self, hidden_states, encoder_hidden_states, temb, rotary_emb, attention_mask
):
    """SkyReelsV2TransformerBlock.forward with Wan's fused chains; its diffusion-forcing
    temb (B, 6, S, D) gives per-token modulation, and self-attention takes its mask."""
    from diffusers.models.transformers.transformer_skyreels_v2 import SkyReelsV2TransformerBlock

    if (
        common.needs_grad(self, hidden_states, temb)
        or not _block_ok(self)
        or temb.dim() not in (3, 4)
    ):
        return SkyReelsV2TransformerBlock.forward(
            self, hidden_states, encoder_hidden_states, temb, rotary_emb, attention_mask
        )
    if temb.dim() == 4:
        mods = [
            m.squeeze(1)
            for m in (self.scale_shift_table.unsqueeze(2) + temb.float()).chunk(6, dim=1)
        ]
    else:
        mods = (self.scale_shift_table + temb.float()).chunk(6, dim=1)
    return _chain(self, hidden_states, encoder_hidden_states, mods, rotary_emb, attention_mask)


def rows8_ok(attn, x, cross: bool = False) -> bool:
    """Whether attention ``attn`` may take its input as the AdaLN kernel's e4m3 rows
    (:class:`~ditfuse.ops.linear_fp8.Rows8`): its processor is ditfuse's Wan processor
    (which hands the input to the projections alone), without a context-parallel config or
    hooks, and every projection that reads it is an FP8 linear of x's dtype -- Q / K / V for
    self-attention, Q alone for cross-attention (``cross``: K / V read the text)."""
    proc = attn.processor
    if cross:
        names = ("to_q",)
    elif getattr(attn, "fused_projections", False):
        names = ("to_qkv",)
    else:
        names = ("to_q", "to_k", "to_v")
    return (
        getattr(proc, "_rows8_input", False)
        and getattr(proc, "_parallel_config", None) is None
        and unhooked(attn)
        and all(is_fp8(getattr(attn, n, None)) for n in names)
        and getattr(attn, names[0]).weight.dtype == x.dtype
    )


def _chain(self, hidden_states, encoder_hidden_states, mods, rotary_emb, attention_mask):
    """The block's arithmetic after its modulation ``mods`` (shift, scale, gate, and the
    FFN's three), with the AdaLN kernels; the self-attention's, the cross-attention's and
    the FFN's inputs in e4m3 where FP8 linears read them alone (``rows8_ok``,
    ``ffn_takes_rows8``)."""
    return wan_chain(
        hidden_states,
        mods,
        self.norm1,
        self.norm2,
        self.norm3,
        lambda n: self.attn1(n, None, attention_mask, rotary_emb),
        lambda n: self.attn2(n, encoder_hidden_states, None, None),
        self.ffn,
        quantize=(
            rows8_ok(self.attn1, hidden_states),
            rows8_ok(self.attn2, hidden_states, cross=True),
            ffn_takes_rows8(self.ffn, hidden_states),
        ),
    )


def wan_chain(
    hidden_states,
    mods,
    norm1,
    cross_norm,
    ffn_norm,
    self_attn,
    cross_attn,
    ffn,
    quantize=(False, False, False),
):
    """Wan's block arithmetic after its modulation ``mods`` (shift, scale, gate and the
    FFN's three; fp32), with the AdaLN kernels: ``norm1`` (affine-free) + modulate ->
    ``self_attn``; the gated residual + ``cross_norm`` (affine, or Identity) ->
    ``cross_attn``; the residual + ``ffn_norm`` (affine-free) + modulate -> ``ffn``; the
    FFN's gated residual. Shared by the blocks of the Wan family, whose norms are named
    differently (Wan: norm1 / norm2 / norm3; Wan-Animate-2: norm1 / norm3 / norm2).
    ``quantize``: (self-attention, cross-attention, FFN) -- hand that branch its input as
    e4m3 rows with a scale a token (``quantize="fp8"``), for FP8 linears that read it alone
    (the cross-attention's only where ``cross_norm`` is a norm: with Identity its input is
    the residual stream itself)."""
    shift, scale, gate, c_shift, c_scale, c_gate = mods
    q_attn, q_cross, q_ffn = ("fp8" if q else None for q in quantize)
    norm_hidden_states = adaln_modulate(
        hidden_states, shift, scale, norm="layer", eps=norm1.eps, quantize=q_attn
    )
    attn_output = self_attn(norm_hidden_states)
    if isinstance(cross_norm, torch.nn.Identity):
        hidden_states = (hidden_states.float() + attn_output * gate).type_as(hidden_states)
        norm_hidden_states = hidden_states
    else:
        hidden_states, norm_hidden_states = gated_residual_adaln(
            hidden_states,
            attn_output,
            gate,
            norm="layer",
            weight=cross_norm.weight,
            bias=cross_norm.bias,
            eps=cross_norm.eps,
            quantize=q_cross,
        )
    attn_output = cross_attn(norm_hidden_states)
    hidden_states, norm_hidden_states = gated_residual_adaln(
        hidden_states,
        attn_output,
        None,
        c_shift,
        c_scale,
        norm="layer",
        eps=ffn_norm.eps,
        quantize=q_ffn,
    )
    return ffn_residual(ffn, norm_hidden_states, hidden_states, c_gate)


def chain_norms_ok(norm1, cross_norm, ffn_norm) -> bool:
    """The norms :func:`wan_chain` reproduces: ``norm1`` and ``ffn_norm`` affine-free
    FP32LayerNorms, ``cross_norm`` an affine one or Identity."""
    from diffusers.models.normalization import FP32LayerNorm

    plain = all(
        isinstance(n, FP32LayerNorm) and n.weight is None and n.bias is None
        for n in (norm1, ffn_norm)
    )
    return plain and (
        isinstance(cross_norm, torch.nn.Identity)
        or (isinstance(cross_norm, FP32LayerNorm) and cross_norm.weight is not None)
    )


def _block_ok(block) -> bool:
    """The block's norms are the FP32LayerNorms the fused chain reproduces."""
    return chain_norms_ok(block.norm1, block.norm2, block.norm3)


def patch_model(model, report, *, qk_norm_rope=True, adaln=True, attention=True, activations=True):
    from diffusers.models.transformers import transformer_wan as tw

    _patch(model, report, tw, qk_norm_rope, adaln, attention)


def patch_animate(
    model, report, *, qk_norm_rope=True, adaln=True, attention=True, activations=True
):
    """Wan 2.2 Animate (WanAnimateTransformer3DModel): Wan's processor, attention and block
    as copies in ``transformer_wan_animate`` (patched like Wan's); its face adapter's
    cross-attention (``WanAnimateFaceBlockAttnProcessor``) keeps its own processor."""
    from diffusers.models.transformers import transformer_wan_animate as ta

    _patch(model, report, ta, qk_norm_rope, adaln, attention)


def patch_chronoedit(
    model, report, *, qk_norm_rope=True, adaln=True, attention=True, activations=True
):
    """ChronoEdit (ChronoEditTransformer3DModel, Wan 2.1 I2V 14B's architecture): Wan's
    processor, attention and block as copies in ``transformer_chronoedit`` (patched like
    Wan's); its own RoPE tables (the temporal-reasoning frames skip positions) arrive as
    Wan's (1, S, 1, D) cos / sin pair."""
    from diffusers.models.transformers import transformer_chronoedit as tc

    _patch(model, report, tc, qk_norm_rope, adaln, attention)


def patch_skyreels(
    model, report, *, qk_norm_rope=True, adaln=True, attention=True, activations=True
):
    """SkyReels-V2 (SkyReelsV2Transformer3DModel): Wan's architecture in its own classes."""
    from diffusers.models.transformers import transformer_skyreels_v2 as ts

    _patch(
        model,
        report,
        ts,
        qk_norm_rope,
        adaln,
        attention,
        ts.SkyReelsV2AttnProcessor,
        ts.SkyReelsV2TransformerBlock,
        _skyreels_block_forward,
        skyreels=True,
    )


def _patch(
    model,
    report,
    module,
    qk_norm_rope,
    adaln,
    attention,
    proc_base=None,
    block_cls=None,
    block_fwd=_block_forward,
    skyreels=False,
):
    """Wan's processors and blocks in diffusers module ``module`` (Wan's, or a copy of them:
    its ``WanAttnProcessor`` and ``WanTransformerBlock`` unless named)."""
    proc_base = proc_base or module.WanAttnProcessor
    block_cls = block_cls or module.WanTransformerBlock
    if qk_norm_rope:
        common.replace_qk_processors(
            model, report, {proc_base: _make_processor(module, proc_base, skyreels)}, attention
        )
    if adaln:  # only blocks whose norms the chain reproduces: the report counts what runs
        for m in model.modules():
            if type(m) is block_cls and _block_ok(m) and common.bind_forward(m, block_fwd, report):
                report.add("blocks (AdaLN)")
