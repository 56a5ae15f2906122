"""Wan 2.x (WanTransformer3DModel: T2V, I2V with ``norm_added_k``, TI2V per-token temb),
Wan 2.2 Animate (WanAnimateTransformer3DModel: Wan's attention and blocks as copies in its
own module, around its face adapter), ChronoEdit (the same copies, its own RoPE rows), and
SkyReels-V2 (the same architecture in its own
classes; diffusion forcing's per-frame temb and block-causal mask)."""
from __future__ import annotations

import torch

from ditfuse.ops.adaln import adaln_modulate, gated_residual, gated_residual_adaln
from ditfuse.ops.qk_norm_rope import qk_norm_rope
from ditfuse.patching.common import FP8, QuantizedQK, attend, attention_8bit, bind_forward, fp8_label, grad_needed, norms_ok, params_need_grad, processor_factory, replace_processors, table_once, use_8bit


def _wan_cos(t):
    return t[..., 0::2].contiguous()


def _wan_sin(t):
    return t[..., 1::2].contiguous()


def _qk(x, norm, H, cos=None, sin=None, k=None, k_norm=None, quantize=None):
    """Norm (+ Wan's RoPE) of q (and k) as (B, S, H*D), into fresh tensors (as Wan's own
    processor: ``norm_q`` and ``apply_rotary_emb`` return new ones); with ``quantize``, their
    8-bit values and per-token scales (``QuantizedQK``, written by the same kernel)."""
    if quantize is None and cos is None and isinstance(norm, torch.nn.Identity) and \
            (k is None or isinstance(k_norm, torch.nn.Identity)):
        return x, k
    D = x.shape[-1] // H
    if cos is not None:
        # Wan rotates with cos[..., 0::2] and sin[..., 1::2] for both channels of a pair:
        # pass exactly those columns as half-width tables (one value a pair, so any table
        # gives Wan's arithmetic, repeat-interleaved or not), packed once per table. The
        # flat kernel's pair form reads a thread's half-table values in one 16-byte load:
        # H200, Wan 14B 480p in place, 338.4 us against 370.6 us with the columns repeated
        # to full width (2026-12-01; before the pair form, on 2026-11-30, the full width
        # was the faster of the two: docs/design/qk_norm_rope.md)
        cos = table_once(cos, "wan-cos", _wan_cos)
        sin = table_once(sin, "wan-sin", _wan_sin)
    # Out of place: the same bits as in place, and faster on the H200 at every Wan shape --
    # 14B 480p 334.0 vs 338.2 us (separate projections), 337.0 vs 351.5 on the chunks of a
    # fused QKV projection, 1.3B 110.0 vs 111.2 (2026-12-01; docs/design/qk_norm_rope.md)
    return qk_norm_rope(x, k, cos, sin, q_norm=norm, k_norm=k_norm, num_heads=H,
                        rotary_dim=D if cos is not None else None,
                        **({"quantize": quantize} if quantize else {}))


def _heads8(r: QuantizedQK, H: int) -> QuantizedQK:
    """(B, S, H*D) quantized Q / K as (B, S, H, D) views (the scales are (B, H, S) already)."""
    return QuantizedQK(r.q.unflatten(2, (H, -1)), None if r.k is None else r.k.unflatten(2, (H, -1)),
                       r.q_scale, r.k_scale)


def _make_processor(tw=None, base=None, skyreels: bool = False):
    """The fused subclass of processor class ``base`` of module ``tw`` (default Wan's
    ``WanAttnProcessor``; Wan Animate's copy of it, or SkyReels-V2's, ``skyreels``; ``tw``
    gives the module's own projection helpers): the same code but for the context-parallel
    config, which SkyReels passes to every attention call and Wan only to self-attention
    (diffusers PR 12909)."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    if tw is None:
        from diffusers.models.transformers import transformer_wan as tw
        base = tw.WanAttnProcessor

    class DitfuseWanAttnProcessor(base):
        """WanAttnProcessor (or SkyReelsV2AttnProcessor) with QK-norm (across heads) + RoPE
        fused into one kernel, and the I2V ``norm_added_k`` through the same kernel.

        Falls back to the base processor's ``__call__`` when autograd needs gradients, when a
        q/k norm is not ``torch.nn.RMSNorm`` / ``Identity``, or when ``rotary_emb`` is not a
        (cos, sin) pair of (1, S, 1, D) tables.

        The eager processor's arithmetic when the RoPE tables are fp32 (as
        ``from_pretrained`` keeps them, ``_keep_in_fp32_modules``), up to the order in which
        the norm's fp32 statistic is summed (bitwise at the tiny models; on the H200 at a
        14B-size norm across heads, 99.999% of the bf16 elements equal torch's RMSNorm, the
        rest one unit apart, 2026-12-02: docs/design/qk_norm_rope.md); a model cast
        whole with ``.to(bfloat16)`` has bf16 tables, where eager Wan rounds every RoPE
        product in bf16 and the kernel rounds once (within a rounding).

        With ``patch(attention="fp8")`` the same kernel also writes Q and K as int8 with
        per-token scales, and self-, cross- and I2V image attention run on
        ``ditfuse.attention(..., precision="fp8")`` where ``common.use_8bit`` holds (head_dim
        64 / 128, a 16-bit model, no context-parallel exchange in the call, a device the
        kernel runs on) and the mask masks nothing (``common.attend``); else the 16-bit path.
        """

        _ditfuse = True
        _ditfuse_fp8 = False

        def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None,
                     rotary_emb=None):
            ok = (norms_ok(attn.norm_q, attn.norm_k)
                  and (attn.add_k_proj is None or norms_ok(attn.norm_added_k))
                  and not grad_needed(hidden_states, encoder_hidden_states)
                  and not params_need_grad(attn))
            if ok and rotary_emb is not None:
                ok = (isinstance(rotary_emb, (tuple, list)) and len(rotary_emb) == 2
                      and rotary_emb[0].dim() == 4 and rotary_emb[0].shape[2] == 1)
            if not ok:
                return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask,
                                        rotary_emb)
            encoder_hidden_states_img = None
            if attn.add_k_proj is not None:
                image_context_length = encoder_hidden_states.shape[1] - 512
                encoder_hidden_states_img = encoder_hidden_states[:, :image_context_length]
                encoder_hidden_states = encoder_hidden_states[:, image_context_length:]

            query, key, value = tw._get_qkv_projections(attn, hidden_states, encoder_hidden_states)
            H = attn.heads
            img = ()
            if encoder_hidden_states_img is not None:
                img = tw._get_added_kv_projections(attn, encoder_hidden_states_img)
            eight = (use_8bit(self, query, value, value.shape[-1] // H, attention_mask,
                              self._parallel_config if skyreels or encoder_hidden_states is None
                              else None)
                     and key.shape[1] > 0 and (not img or (
                         img[0].shape[1] > 0 and (not skyreels or self._parallel_config is None))))

            def attend_16bit(query, key, value, *img):
                if rotary_emb is not None and query.shape == key.shape:
                    query, key = _qk(query, attn.norm_q, H, *rotary_emb, k=key, k_norm=attn.norm_k)
                else:
                    query, _ = _qk(query, attn.norm_q, H, *(rotary_emb or (None, None)))
                    key, _ = _qk(key, attn.norm_k, H)
                query = query.unflatten(2, (H, -1))
                key = key.unflatten(2, (H, -1))
                value = value.unflatten(2, (H, -1))

                hidden_states_img = None
                if img:
                    key_img, value_img = img
                    key_img, _ = _qk(key_img, attn.norm_added_k, H)
                    key_img = key_img.unflatten(2, (H, -1))
                    value_img = value_img.unflatten(2, (H, -1))
                    hidden_states_img = dispatch_attention_fn(
                        query, key_img, value_img, attn_mask=None, dropout_p=0.0, is_causal=False,
                        backend=self._attention_backend,
                        parallel_config=self._parallel_config if skyreels else None)
                    hidden_states_img = hidden_states_img.flatten(2, 3).type_as(query)

                hidden_states = dispatch_attention_fn(
                    query, key, value, attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
                    backend=self._attention_backend,
                    parallel_config=(self._parallel_config if skyreels or encoder_hidden_states is None
                                     else None))
                hidden_states = hidden_states.flatten(2, 3).type_as(query)
                if hidden_states_img is not None:
                    hidden_states = hidden_states + hidden_states_img
                return hidden_states

            def attend_8bit(query, key, value, *img):
                # Q (and K) normalised (and rotated) and quantized by one kernel; the I2V
                # image keys attended with the same quantized Q
                if rotary_emb is not None and query.shape == key.shape:
                    qk = _qk(query, attn.norm_q, H, *rotary_emb, k=key, k_norm=attn.norm_k,
                             quantize="int8")
                else:
                    q = _qk(query, attn.norm_q, H, *(rotary_emb or (None, None)), quantize="int8")
                    k = _qk(key, attn.norm_k, H, quantize="int8")
                    qk = QuantizedQK(q.q, k.q, q.q_scale, k.q_scale)
                qk = _heads8(qk, H)
                hidden_states = attention_8bit(qk, value.unflatten(2, (H, -1))).flatten(2, 3)
                if img:
                    key_img, value_img = img
                    k_img = _heads8(_qk(key_img, attn.norm_added_k, H, quantize="int8"), H)
                    hidden_states = hidden_states + attention_8bit(
                        qk, value_img.unflatten(2, (H, -1)), k=k_img.q,
                        k_scale=k_img.q_scale).flatten(2, 3)
                return hidden_states

            hidden_states = attend(eight, attention_mask, attend_8bit, attend_16bit,
                                   (query, key, value, *img))
            hidden_states = attn.to_out[0](hidden_states)
            hidden_states = attn.to_out[1](hidden_states)
            return hidden_states

    if skyreels:
        DitfuseWanAttnProcessor.__name__ = DitfuseWanAttnProcessor.__qualname__ = \
            "DitfuseSkyReelsV2AttnProcessor"
    return DitfuseWanAttnProcessor


def _block_forward(self, hidden_states, encoder_hidden_states, temb, rotary_emb):
    """WanTransformerBlock.forward with the three AdaLN chains fused (same arithmetic: fp32
    math, the model's casts): norm1 + modulate; gated residual + norm2; residual + norm3 +
    modulate; the FFN's gated residual (which feeds the next block) alone."""
    if grad_needed(hidden_states, temb) or params_need_grad(self) or not _block_ok(self):
        # the class's own forward (bound on exact WanTransformerBlock types: Wan's, or Wan
        # Animate's copy of it)
        return type(self).forward(self, hidden_states, encoder_hidden_states, temb, rotary_emb)
    if temb.ndim == 4:  # (B, S, 6, D): Wan 2.2 TI2V, per-token modulation
        mods = (self.scale_shift_table.unsqueeze(0) + temb.float()).chunk(6, dim=2)
        mods = [m.squeeze(2) for m in mods]
    else:
        mods = (self.scale_shift_table + temb.float()).chunk(6, dim=1)
    return _chain(self, hidden_states, encoder_hidden_states, mods, rotary_emb, None)


def _skyreels_block_forward(self, hidden_states, encoder_hidden_states, temb, rotary_emb,
                            attention_mask):
    """SkyReelsV2TransformerBlock.forward with Wan's fused chains; its diffusion-forcing
    temb (B, 6, S, D) gives per-token modulation, and self-attention takes its mask."""
    from diffusers.models.transformers.transformer_skyreels_v2 import SkyReelsV2TransformerBlock

    if grad_needed(hidden_states, temb) or params_need_grad(self) or not _block_ok(self) or \
            temb.dim() not in (3, 4):
        return SkyReelsV2TransformerBlock.forward(self, hidden_states, encoder_hidden_states, temb,
                                                  rotary_emb, attention_mask)
    if temb.dim() == 4:
        mods = [m.squeeze(1) for m in
                (self.scale_shift_table.unsqueeze(2) + temb.float()).chunk(6, dim=1)]
    else:
        mods = (self.scale_shift_table + temb.float()).chunk(6, dim=1)
    return _chain(self, hidden_states, encoder_hidden_states, mods, rotary_emb, attention_mask)


def _chain(self, hidden_states, encoder_hidden_states, mods, rotary_emb, attention_mask):
    """The block's arithmetic after its modulation ``mods`` (shift, scale, gate, and the
    FFN's three), with the AdaLN kernels."""
    return wan_chain(hidden_states, mods, self.norm1, self.norm2, self.norm3,
                     lambda n: self.attn1(n, None, attention_mask, rotary_emb),
                     lambda n: self.attn2(n, encoder_hidden_states, None, None), self.ffn)


def wan_chain(hidden_states, mods, norm1, cross_norm, ffn_norm, self_attn, cross_attn, ffn):
    """Wan's block arithmetic after its modulation ``mods`` (shift, scale, gate and the
    FFN's three; fp32), with the AdaLN kernels: ``norm1`` (affine-free) + modulate ->
    ``self_attn``; the gated residual + ``cross_norm`` (affine, or Identity) ->
    ``cross_attn``; the residual + ``ffn_norm`` (affine-free) + modulate -> ``ffn``; the
    FFN's gated residual. Shared by the blocks of the Wan family, whose norms are named
    differently (Wan: norm1 / norm2 / norm3; Wan-Animate-2: norm1 / norm3 / norm2)."""
    shift, scale, gate, c_shift, c_scale, c_gate = mods
    norm_hidden_states = adaln_modulate(hidden_states, shift, scale, norm="layer", eps=norm1.eps)
    attn_output = self_attn(norm_hidden_states)
    if isinstance(cross_norm, torch.nn.Identity):
        hidden_states = (hidden_states.float() + attn_output * gate).type_as(hidden_states)
        norm_hidden_states = hidden_states
    else:
        hidden_states, norm_hidden_states = gated_residual_adaln(
            hidden_states, attn_output, gate, norm="layer", weight=cross_norm.weight,
            bias=cross_norm.bias, eps=cross_norm.eps)
    attn_output = cross_attn(norm_hidden_states)
    hidden_states, norm_hidden_states = gated_residual_adaln(
        hidden_states, attn_output, None, c_shift, c_scale, norm="layer", eps=ffn_norm.eps)
    return gated_residual(hidden_states, ffn(norm_hidden_states), c_gate)


def chain_norms_ok(norm1, cross_norm, ffn_norm) -> bool:
    """The norms :func:`wan_chain` reproduces: ``norm1`` and ``ffn_norm`` affine-free
    FP32LayerNorms, ``cross_norm`` an affine one or Identity."""
    from diffusers.models.normalization import FP32LayerNorm

    plain = all(isinstance(n, FP32LayerNorm) and n.weight is None and n.bias is None
                for n in (norm1, ffn_norm))
    return plain and (isinstance(cross_norm, torch.nn.Identity) or (
        isinstance(cross_norm, FP32LayerNorm) and cross_norm.weight is not None))


def _block_ok(block) -> bool:
    """The block's norms are the FP32LayerNorms the fused chain reproduces."""
    return chain_norms_ok(block.norm1, block.norm2, block.norm3)


def patch_model(model, report, *, qk_norm_rope=True, adaln=True, attention=True,
                activations=True):
    from diffusers.models.transformers import transformer_wan as tw

    _patch(model, report, qk_norm_rope, adaln, tw, tw.WanAttnProcessor, tw.WanTransformerBlock,
           _block_forward, skyreels=False, attention=attention)


def patch_animate(model, report, *, qk_norm_rope=True, adaln=True, attention=True,
                  activations=True):
    """Wan 2.2 Animate (WanAnimateTransformer3DModel): Wan's processor, attention and block
    as copies in ``transformer_wan_animate`` (patched like Wan's); its face adapter's
    cross-attention (``WanAnimateFaceBlockAttnProcessor``) keeps its own processor."""
    from diffusers.models.transformers import transformer_wan_animate as ta

    _patch(model, report, qk_norm_rope, adaln, ta, ta.WanAttnProcessor, ta.WanTransformerBlock,
           _block_forward, skyreels=False, attention=attention)


def patch_chronoedit(model, report, *, qk_norm_rope=True, adaln=True, attention=True,
                     activations=True):
    """ChronoEdit (ChronoEditTransformer3DModel, Wan 2.1 I2V 14B's architecture): Wan's
    processor, attention and block as copies in ``transformer_chronoedit`` (patched like
    Wan's); its own RoPE tables (the temporal-reasoning frames skip positions) arrive as
    Wan's (1, S, 1, D) cos / sin pair."""
    from diffusers.models.transformers import transformer_chronoedit as tc

    _patch(model, report, qk_norm_rope, adaln, tc, tc.WanAttnProcessor, tc.WanTransformerBlock,
           _block_forward, skyreels=False, attention=attention)


def patch_skyreels(model, report, *, qk_norm_rope=True, adaln=True, attention=True,
                   activations=True):
    """SkyReels-V2 (SkyReelsV2Transformer3DModel): Wan's architecture in its own classes."""
    from diffusers.models.transformers import transformer_skyreels_v2 as ts

    _patch(model, report, qk_norm_rope, adaln, ts, ts.SkyReelsV2AttnProcessor,
           ts.SkyReelsV2TransformerBlock, _skyreels_block_forward, skyreels=True, attention=attention)


def _patch(model, report, qk_norm_rope, adaln, module, proc_base, block_cls, block_fwd, skyreels,
           attention=True):
    if qk_norm_rope:
        fp8 = attention == FP8
        proc = processor_factory(_make_processor(module, proc_base, skyreels), fp8)
        replace_processors(model, report, {proc_base: proc},
                           fp8_label("attention processors (QK-norm + RoPE)", fp8))
    if adaln:  # only blocks whose norms the chain reproduces: the report counts what runs
        for m in model.modules():
            if type(m) is block_cls and _block_ok(m) and bind_forward(m, block_fwd, report):
                report.add("blocks (AdaLN)")
