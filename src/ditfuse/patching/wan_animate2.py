"""Wan-Animate-2 (WanAnimate2Transformer3DModel): Wan 2.x's block arithmetic around an
in-context reference pass. Its self-attention normalises Q / K across heads, caches the
*normalised, unrotated* K / V of the reference video (``kv_cache_mode="extract"``) and
rotates with ``rope_apply`` -- complex fp64 multipliers per (frame, row, column) of each
sample's patch grid, frames optionally strided -- before a dense pass ("extract") or a
flex block-mask pass over the generation tokens and the rotated cached reference keys
("cached"). Its cross-attention normalises Q, K and the CLIP image keys."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ditfuse.ops.qk_norm_rope import QuantizedQK, qk_norm_rope
from ditfuse.patching import common
from ditfuse.patching.wan import (
    _heads8,
    _qk,
    attention_8bit_i2v,
    chain_norms_ok,
    norm_rope,
    projected,
    wan_chain,
)


def _grid_list(grid_sizes) -> list | None:
    if not (
        isinstance(grid_sizes, torch.Tensor) and grid_sizes.dim() == 2 and grid_sizes.shape[1] == 3
    ):
        return None
    return [tuple(int(v) for v in row) for row in grid_sizes.tolist()]


def _tables_ok(freqs, grid, stride: int, S: int, D: int) -> bool:
    """Whether :func:`_tables` reproduces ``rope_apply(x, grid, freqs, stride)`` for (B, S)
    tokens of head_dim D: a complex (rows, D/2) table whose rows cover every sample's frames
    (at the stride), rows and columns, and every sample's grid within its S tokens."""
    if not (
        isinstance(freqs, torch.Tensor)
        and freqs.is_complex()
        and freqs.dim() == 2
        and freqs.shape[1] * 2 == D
        and isinstance(stride, int)
        and stride >= 1
    ):
        return False
    rows = freqs.shape[0]
    return all(
        f >= 1
        and h >= 1
        and w >= 1
        and f * h * w <= S
        and (f - 1) * stride < rows
        and h <= rows
        and w <= rows
        for f, h, w in grid
    )


def _tables(freqs, grid, stride: int, S: int):
    """fp32 half-width (unique-frequency) cos / sin, (S, D/2) when every sample has the same
    grid, else (B, S, D/2): row ``t`` of sample ``i`` is the complex multiplier ``rope_apply``
    gives token ``t`` -- frame, row and column frequencies of its grid cell, the frames
    ``stride`` apart -- rounded from fp64 to fp32; tokens past the sample's ``f*h*w`` are
    passed through by ``rope_apply``: cos 1, sin 0 (``x * 1 - y * 0`` is ``x`` exactly)."""
    c = freqs.shape[1]
    # the (real, imaginary) fp64 view: no complex op (inductor does not generate code for
    # complex arithmetic; under torch.compile this runs in the graph)
    parts = torch.view_as_real(freqs).split([c - 2 * (c // 3), c // 3, c // 3], dim=1)
    out = []
    for f, h, w in grid[:1] if len(set(grid)) == 1 else grid:
        cell = torch.cat(
            [
                parts[0][: f * stride : stride].view(f, 1, 1, -1, 2).expand(f, h, w, -1, 2),
                parts[1][:h].view(1, h, 1, -1, 2).expand(f, h, w, -1, 2),
                parts[2][:w].view(1, 1, w, -1, 2).expand(f, h, w, -1, 2),
            ],
            dim=-2,
        )
        cell = cell.reshape(f * h * w, c, 2).float()
        cos, sin = cell[..., 0].contiguous(), cell[..., 1].contiguous()
        if f * h * w < S:
            pad = S - f * h * w
            cos = torch.cat([cos, cos.new_ones(pad, c)])
            sin = torch.cat([sin, sin.new_zeros(pad, c)])
        out.append((cos, sin))
    if len(out) == 1:
        return out[0]
    return torch.stack([c for c, _ in out]), torch.stack([s for _, s in out])


def _rope_tables(freqs, grid, stride, S):
    """:func:`_tables`, built once a step: every block of a step receives the same ``freqs``
    object (the model's ``rope_freqs_cache`` keeps one a stream) with the same grid. One slot
    a table: the last grid's tables (a new resolution replaces them, so a long-lived table
    does not collect one set per resolution ever run)."""
    slot = common.table_once(freqs, "wan-animate-2", lambda f: {})
    key = (tuple(grid), stride, S)
    if slot.get("key") != key:
        slot["tables"] = _tables(freqs, grid, stride, S)
        slot["key"] = key
    return slot["tables"]


def _rotate(x, cos, sin, H, quantize=None):
    """``rope_apply`` on already-normalised rows ``x`` (B, S, H*D) or (B, S, H, D): the
    rotation alone (no norm), into a fresh tensor (``quantize``: its ``QuantizedQK``)."""
    D = x.shape[-1] if x.dim() == 4 else x.shape[-1] // H
    out = qk_norm_rope(
        x,
        None,
        cos,
        sin,
        num_heads=None if x.dim() == 4 else H,
        rotary_dim=D,
        quantize=quantize,
    )
    return out if quantize else out[0]


@dataclass
class _SelfAttnArgs:
    """What WanAnimate2AttnProcessor takes after (attn, hidden_states), by its names and with
    its defaults (the module passes them by name)."""

    rotary_emb: torch.Tensor
    grid_sizes: torch.Tensor
    kv_cache: object
    kv_cache_mode: str
    rope_stride: int = 1
    reference_rotary_emb: torch.Tensor | None = None
    reference_grid_sizes: torch.Tensor | None = None
    reference_rope_stride: int = 1
    attention_mask: object = None  # a flex BlockMask
    origin_latent_frames: int | None = None
    origin_latent_hw: int | None = None


def _make_processors():
    from diffusers.models.attention_dispatch import AttentionBackendName, dispatch_attention_fn
    from diffusers.models.transformers import transformer_wan_animate_2 as ta

    class DitfuseWanAnimate2AttnProcessor(common.EightBitProcessor, ta.WanAnimate2AttnProcessor):
        """WanAnimate2AttnProcessor with the QK-norm (across heads) and ``rope_apply`` as
        ditfuse kernels: "extract" normalises K once (the cached rows), rotates them, and
        normalises + rotates Q in one pass; "cached" normalises + rotates Q and K in one pass
        and rotates the cached reference K; the packing and attention as the processor's.

        ``rope_apply`` is a function of the processor's module that it calls directly (no
        per-instance swap), so the processor's code is not run here: "cached"'s packing is
        rewritten in :func:`_packed_attention`.

        Numerical contract: the norms within one rounding of ``torch.nn.RMSNorm`` (their
        fp32 statistic summed in another order: docs/design/end_to_end.md); the rotation in fp32
        without fused multiply-add on the multipliers rounded from fp64 to fp32, where
        ``rope_apply`` multiplies in fp64 and rounds to fp32 and then to the activation dtype:
        within one rounding of the result plus a few fp32 roundings of the pair's size (where
        the rotation cancels, many bf16 units of the tiny result; measured:
        docs/design/qk_norm_rope.md).

        Falls back to the base processor when autograd needs gradients, a norm is not one
        the kernel reads, or the rotary table / grid is not one :func:`_tables` reproduces.

        With ``patch(attention="fp8")``, "extract": the dense pass (no mask) on
        ``ditfuse.attention(..., precision="fp8")`` where ``common.use_8bit`` holds, the
        rotated Q / K from their kernels as ``common.qk_8bit`` says (the cache keeps the
        normalised 16-bit K); "cached" (a flex block mask) keeps the 16-bit path.
        """

        def __call__(self, attn, hidden_states, *args, **kwargs):
            a = _SelfAttnArgs(*args, **kwargs)
            H = attn.heads
            ok = (
                a.kv_cache_mode in ("extract", "cached")
                and hidden_states.dim() == 3
                and hidden_states.shape[-1] % H == 0
                and common.norms_ok(attn.norm_q, attn.norm_k)
                and not common.needs_grad(attn, hidden_states)
            )
            grid = _grid_list(a.grid_sizes) if ok else None
            S = hidden_states.shape[1]
            D = hidden_states.shape[-1] // H if ok else 0
            ok = (
                grid is not None
                and len(grid) == hidden_states.shape[0]
                and _tables_ok(a.rotary_emb, grid, a.rope_stride, S, D)
            )
            if ok and a.kv_cache_mode == "cached":
                ref_grid = _grid_list(a.reference_grid_sizes)
                key_ref = getattr(a.kv_cache, "key", None)
                ok = (
                    ref_grid is not None
                    and isinstance(key_ref, torch.Tensor)
                    and key_ref.dim() == 4
                    and len(ref_grid) == key_ref.shape[0]
                    and _tables_ok(
                        a.reference_rotary_emb,
                        ref_grid,
                        a.reference_rope_stride,
                        key_ref.shape[1],
                        key_ref.shape[-1],
                    )
                )
            if not ok:
                return super().__call__(attn, hidden_states, *args, **kwargs)

            query, key, value = ta._get_qkv_projections(attn, hidden_states, None)
            cos, sin = _rope_tables(a.rotary_emb, grid, a.rope_stride, S)
            value = value.unflatten(2, (H, -1))
            if a.kv_cache_mode == "extract":
                # the cache holds the normalised K; the rotated K is that K rotated, so the
                # two agree as the processor's do (one norm, then rope_apply)
                key, _ = _qk(key, attn.norm_k, H)
                a.kv_cache.store(key.unflatten(2, (H, -1)), value)
                if common.use_8bit(self, query, value, D, None, self._parallel_config):
                    quantize = common.qk_8bit()
                    q = qk_norm_rope(
                        query,
                        None,
                        cos,
                        sin,
                        q_norm=attn.norm_q,
                        num_heads=H,
                        rotary_dim=D,
                        quantize=quantize,
                    )
                    k = _rotate(key, cos, sin, H, quantize=quantize)
                    if quantize:
                        qk = _heads8(QuantizedQK(q.q, k.q, q.q_scale, k.q_scale), H)
                    else:
                        qk = (q[0].unflatten(2, (H, -1)), k.unflatten(2, (H, -1)))
                    hidden_states = common.attention_8bit(qk, value).flatten(2, 3)
                    hidden_states = attn.to_out[0](hidden_states)
                    return attn.to_out[1](hidden_states)
                query = qk_norm_rope(
                    query, None, cos, sin, q_norm=attn.norm_q, num_heads=H, rotary_dim=D
                )[0]
                key = _rotate(key, cos, sin, H)
                hidden_states = dispatch_attention_fn(
                    query.unflatten(2, (H, -1)),
                    key.unflatten(2, (H, -1)),
                    value,
                    attn_mask=None,
                    backend=self._attention_backend,
                    parallel_config=self._parallel_config,
                )
            else:
                query, key = common.attn_qk_norm_rope(
                    attn, query, key, cos, sin, num_heads=H, rotary_dim=D
                )
                query, key = query.unflatten(2, (H, -1)), key.unflatten(2, (H, -1))
                key_ref, value_ref = a.kv_cache.get()
                rcos, rsin = _rope_tables(
                    a.reference_rotary_emb, ref_grid, a.reference_rope_stride, key_ref.shape[1]
                )
                key_ref = _rotate(key_ref, rcos, rsin, H)
                hidden_states = _packed_attention(
                    query,
                    key,
                    value,
                    key_ref,
                    value_ref,
                    grid[0],
                    ref_grid[0],
                    a.origin_latent_frames,
                    a.origin_latent_hw,
                    a.attention_mask,
                    self._parallel_config,
                    dispatch_attention_fn,
                    AttentionBackendName.FLEX,
                )
            hidden_states = hidden_states.flatten(2, 3).type_as(query)
            hidden_states = attn.to_out[0](hidden_states)
            hidden_states = attn.to_out[1](hidden_states)
            return hidden_states

    class DitfuseWanAnimate2CrossAttnProcessor(
        common.EightBitProcessor, ta.WanAnimate2CrossAttnProcessor
    ):
        """WanAnimate2CrossAttnProcessor with ``norm_q``, ``norm_k`` and the CLIP keys'
        ``norm_added_k`` (RMSNorms across heads) as ditfuse kernels (within one rounding of
        ``torch.nn.RMSNorm``: the statistic's summation order), the processor's own code
        around them (:func:`~ditfuse.patching.wan.projected`). Falls back to the base
        processor when autograd needs gradients or a norm is not one the kernel reads. With
        ``patch(attention="fp8")``: both attentions (no mask) on 8 bits where
        ``common.use_8bit`` holds, Q and the (text, image) keys from their kernels as
        ``common.qk_8bit`` says."""

        def __call__(
            self, attn, hidden_states, encoder_hidden_states, encoder_hidden_states_image=None
        ):
            H = attn.heads
            with_image = encoder_hidden_states_image is not None
            ok = (
                hidden_states.dim() == 3
                and encoder_hidden_states.dim() == 3
                and hidden_states.shape[-1] % H == 0
                and common.norms_ok(attn.norm_q, attn.norm_k)
                and (not with_image or common.norms_ok(attn.norm_added_k))
                and not common.needs_grad(
                    attn, hidden_states, encoder_hidden_states, encoder_hidden_states_image
                )
            )
            if not ok:
                return super().__call__(
                    attn, hidden_states, encoder_hidden_states, encoder_hidden_states_image
                )
            query, key, value = ta._get_qkv_projections(attn, hidden_states, encoder_hidden_states)
            img = ()
            if with_image:
                img = ta._get_added_kv_projections(attn, encoder_hidden_states_image)
            if common.use_8bit(
                self, query, value, value.shape[-1] // H, None, self._parallel_config
            ):
                qk = norm_rope(attn, query, key, quantize=common.qk_8bit())
                hidden_states = attention_8bit_i2v(attn, qk, value, img)
            else:  # the processor's own code on the normalised Q / K and image keys
                hidden_states = super().__call__(
                    projected(attn, query, key, value, img),
                    hidden_states,
                    encoder_hidden_states,
                    encoder_hidden_states_image,
                )
            hidden_states = attn.to_out[0](hidden_states)
            return attn.to_out[1](hidden_states)

    return {
        ta.WanAnimate2AttnProcessor: DitfuseWanAnimate2AttnProcessor,
        ta.WanAnimate2CrossAttnProcessor: DitfuseWanAnimate2CrossAttnProcessor,
    }


def _packed_attention(
    query,
    key,
    value,
    key_ref,
    value_ref,
    grid,
    ref_grid,
    frames_total,
    hw_total,
    block_mask,
    parallel_config,
    dispatch,
    flex,
):
    """The "cached" pass's attention, as WanAnimate2AttnProcessor lays it out: the first
    sample's grid places each generation frame's tokens (and the rotated cached reference
    frames') at the start of a frame slot of ``hw_total`` tokens in zero buffers, both
    segments padded to a multiple of 128 (the block mask's granularity); the generation
    tokens' rows are read back and the tokens past the grid pass through as their rotated
    queries."""
    frames, height, width = grid
    ref_frames, ref_height, ref_width = ref_grid
    hw, ref_hw = height * width, ref_height * ref_width
    n = frames * hw
    B, _, H, D = query.shape
    length = math.ceil((frames_total + 1) * hw_total / 128) * 128
    ref_length = math.ceil(frames_total * hw_total / 128) * 128

    def slots(buf, start, count, src, src_hw):
        buf[:, start : start + count * hw_total].view(B, count, hw_total, H, D)[:, :, :src_hw] = (
            src[:, : count * src_hw].view(B, count, src_hw, H, D)
        )

    q_buf = query.new_zeros(B, length, H, D)
    k_buf = key.new_zeros(B, length + ref_length, H, D)
    v_buf = value.new_zeros(B, length + ref_length, H, D)
    slots(q_buf, 0, frames, query, hw)
    slots(k_buf, 0, frames, key, hw)
    slots(v_buf, 0, frames, value, hw)
    slots(k_buf, length, ref_frames, key_ref, ref_hw)
    slots(v_buf, length, ref_frames, value_ref, ref_hw)
    out = dispatch(
        q_buf, k_buf, v_buf, attn_mask=block_mask, backend=flex, parallel_config=parallel_config
    )
    out = out[:, : frames * hw_total].view(B, frames, hw_total, H, D)[:, :, :hw].reshape(B, n, H, D)
    return torch.cat([out, query[:, n:]], dim=1)


def _block_ok(block) -> bool:
    """Wan's chain norms (here norm1, norm3 before cross-attention, norm2 before the FFN) and
    the modulation table in fp32 (as ``from_pretrained`` keeps it: ``_keep_in_fp32_modules``;
    a model cast whole adds it to the temb in bf16)."""
    return (
        chain_norms_ok(block.norm1, block.norm3, block.norm2)
        and block.modulation.dtype == torch.float32
    )


def _block_fusable(self, hidden_states, temb, *_, **__) -> bool:
    """The block's norms and modulation table as :func:`_block_ok` says, an fp32 (B, 6, C)
    temb, no autograd."""
    return (
        not common.needs_grad(self, hidden_states, temb)
        and _block_ok(self)
        and temb.dtype == torch.float32
        and temb.dim() == 3
    )


@common.fused_if(_block_fusable)
def _block_forward(
    self,
    hidden_states,
    temb,
    encoder_hidden_states,
    kv_cache,
    kv_cache_mode,
    rotary_emb,
    grid_sizes,
    encoder_hidden_states_image=None,
    reference_rotary_emb=None,
    reference_grid_sizes=None,
    attention_mask=None,
    origin_latent_frames=None,
    origin_latent_hw=None,
):
    """WanAnimate2TransformerBlock.forward with Wan's AdaLN chains fused (same arithmetic:
    fp32 math, the model's casts): norm1 + modulate; the gated residual + norm3 (the
    cross-attention's input); the residual + norm2 + modulate; the FFN's gated residual."""
    attn_kw = dict(
        rotary_emb=rotary_emb,
        grid_sizes=grid_sizes,
        kv_cache=kv_cache,
        kv_cache_mode=kv_cache_mode,
        rope_stride=self.refer_stride if kv_cache_mode == "extract" else 1,
        reference_rotary_emb=reference_rotary_emb,
        reference_grid_sizes=reference_grid_sizes,
        reference_rope_stride=self.refer_stride,
        attention_mask=attention_mask,
        origin_latent_frames=origin_latent_frames,
        origin_latent_hw=origin_latent_hw,
    )
    return wan_chain(
        hidden_states,
        (self.modulation + temb).chunk(6, dim=1),
        self.norm1,
        self.norm3,
        self.norm2,
        lambda n: self.self_attn(n, **attn_kw),
        lambda n: self.cross_attn(
            n,
            encoder_hidden_states=encoder_hidden_states,
            encoder_hidden_states_image=encoder_hidden_states_image,
        ),
        self.ffn,
    )


def patch_model(model, report, *, qk_norm_rope=True, adaln=True, attention=True, activations=True):
    from diffusers.models.transformers.transformer_wan_animate_2 import WanAnimate2TransformerBlock

    if qk_norm_rope:
        common.replace_qk_processors(model, report, _make_processors(), attention)
    if adaln:
        for m in model.modules():
            if (
                type(m) is WanAnimate2TransformerBlock
                and _block_ok(m)
                and common.bind_forward(m, _block_forward, report)
            ):
                report.add("blocks (AdaLN)")
