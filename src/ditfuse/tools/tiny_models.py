"""Tiny configurations of every model ``ditfuse.patch`` covers (random weights, no
downloads), with inputs: shared by the tests and ``ditfuse check``."""

from __future__ import annotations

import torch


def to_dtype(model, dtype):
    """Cast in place as ``from_pretrained(torch_dtype=dtype)`` leaves a model: floating
    parameters and persistent buffers to ``dtype``, except those under a
    ``_keep_in_fp32_modules`` name (fp32: Wan computes its RoPE tables and modulation in
    fp32); non-persistent buffers (RoPE tables, SAME's ``inv_freq``) are not in a checkpoint
    and keep the dtype ``__init__`` gave them. (``ModelMixin.to(dtype)`` would cast those
    too, and warns.) Shared by the tests, ``ditfuse check`` and ``ditfuse bench --e2e``."""
    keep = getattr(model, "_keep_in_fp32_modules", None) or []
    persistent = set(model.state_dict().keys())

    def target(name):
        return torch.float32 if any(k in name.split(".") for k in keep) else dtype

    for mname, mod in model.named_modules():
        prefix = mname + "." if mname else ""
        for pname, p in mod.named_parameters(recurse=False):
            if p.is_floating_point():
                p.data = p.data.to(target(prefix + pname))
        for bname, b in list(mod.named_buffers(recurse=False)):
            if b is not None and b.is_floating_point() and prefix + bname in persistent:
                mod._buffers[bname] = b.to(target(prefix + bname))
    return model


# ---------------------------------------------------------------------------------------
# Each transformer family's tiny class arguments, layer counts apart: built below (with their
# layer counts) and passed by ``ditfuse bench --e2e``'s CPU runs as overrides of the
# real-size configs


def _tiny(head_dim, **fields):
    """A tiny transformer's class arguments: two heads of ``head_dim`` and 4 input channels,
    then the family's own ``fields`` (which may override those)."""
    return {"num_attention_heads": 2, "attention_head_dim": head_dim, "in_channels": 4, **fields}


TINY_WAN = _tiny(12, out_channels=4, text_dim=16, ffn_dim=32, rope_max_seq_len=32)
TINY_FLUX1 = _tiny(16, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=(4, 4, 8))
TINY_FLUX2 = _tiny(
    16, joint_attention_dim=32, timestep_guidance_channels=32, axes_dims_rope=(4, 4, 4, 4)
)
TINY_QWEN_IMAGE = _tiny(
    16, in_channels=16, out_channels=4, joint_attention_dim=16, axes_dims_rope=(8, 4, 4)
)
TINY_HUNYUAN_VIDEO = _tiny(
    10,
    out_channels=4,
    num_refiner_layers=1,
    patch_size=1,
    text_embed_dim=16,
    pooled_projection_dim=8,
    rope_axes_dim=(2, 4, 4),
)


def _axes(head_dim, n):
    """RoPE axis widths (even, summing to ``head_dim``) of a tiny model at another head_dim:
    the first axis takes what the equal split of the others leaves."""
    rest = (head_dim // n) // 2 * 2
    return [head_dim - rest * (n - 1)] + [rest] * (n - 1)


def _at_head_dim(cfg, head_dim, axes_key=None, axes=None):
    """``cfg`` at ``head_dim``; its RoPE axes (``cfg[axes_key]``) then ``axes(head_dim)``."""
    if head_dim == cfg["attention_head_dim"]:
        return cfg
    return {
        **cfg,
        "attention_head_dim": head_dim,
        **({axes_key: axes(head_dim)} if axes_key else {}),
    }


def _randomize(m, seed=0):  # noqa: D103
    g = torch.Generator().manual_seed(seed)
    for p in m.parameters():
        p.data.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return m.eval()


def _wan(i2v=False, head_dim=12):
    from diffusers import WanTransformer3DModel

    kw = dict(
        _at_head_dim(TINY_WAN, head_dim),
        patch_size=(1, 2, 2),
        freq_dim=256,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
    )
    if i2v:
        kw.update(image_dim=8, added_kv_proj_dim=2 * head_dim)
    return _randomize(WanTransformer3DModel(**kw))


def _wan_inputs(dtype, i2v=False, per_token=False, text=6):
    """``text``: prompt tokens (Wan I2V's cross-attention takes the tokens before the last
    512 as the image's: with fewer, its image keys are empty)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 4, 1, 8, 8, generator=g).to(dtype)
    e = torch.randn(1, text, 16, generator=g).to(dtype)
    kw = dict(hidden_states=x, encoder_hidden_states=e, return_dict=False)
    if per_token:  # Wan 2.2 TI2V: one timestep per token
        kw["timestep"] = torch.full((1, 16), 500.0).to(dtype)
    else:
        kw["timestep"] = torch.tensor([500.0]).to(dtype)
    if i2v:
        kw["encoder_hidden_states_image"] = torch.randn(1, 3, 8, generator=g).to(dtype)
    return kw


def _flux(head_dim=16):
    from diffusers import FluxTransformer2DModel

    cfg = _at_head_dim(TINY_FLUX1, head_dim, "axes_dims_rope", lambda d: _axes(d, 3))
    return _randomize(
        FluxTransformer2DModel(**cfg, patch_size=1, num_layers=1, num_single_layers=2)
    )


def _flux_inputs(dtype, flux2=False):
    """FLUX.1's inputs, or FLUX.2's (``flux2``: no pooled projection, batched ids of four
    axes, guidance)."""
    g = torch.Generator().manual_seed(3 if flux2 else 2)
    S, T = 16, 8
    kw = dict(
        hidden_states=torch.randn(1, S, 4, generator=g).to(dtype),
        encoder_hidden_states=torch.randn(1, T, 32, generator=g).to(dtype),
    )
    if not flux2:
        kw["pooled_projections"] = torch.randn(1, 32, generator=g).to(dtype)
    kw["timestep"] = torch.tensor([0.5]).to(dtype)

    def ids(n):  # FLUX.2's are batched
        return torch.randn(1, n, 4, generator=g) if flux2 else torch.randn(n, 3, generator=g)

    kw.update(img_ids=ids(S), txt_ids=ids(T))
    if flux2:
        kw["guidance"] = torch.tensor([3.5]).to(dtype)
    return dict(kw, return_dict=False)


def _flux2(head_dim=16):
    from diffusers import Flux2Transformer2DModel

    cfg = _at_head_dim(TINY_FLUX2, head_dim, "axes_dims_rope", lambda d: (d // 4,) * 4)
    return _randomize(
        Flux2Transformer2DModel(**cfg, patch_size=1, num_layers=1, num_single_layers=1)
    )


def _hunyuan(single_layers=1, head_dim=10):
    from diffusers import HunyuanVideoTransformer3DModel

    cfg = _at_head_dim(TINY_HUNYUAN_VIDEO, head_dim, "rope_axes_dim", lambda d: _axes(d, 3))
    return _randomize(
        HunyuanVideoTransformer3DModel(
            **cfg,
            num_layers=1,
            num_single_layers=single_layers,
            patch_size_t=1,
            guidance_embeds=True,
        )
    )


def _hunyuan_inputs(dtype):
    g = torch.Generator().manual_seed(4)
    return dict(
        hidden_states=torch.randn(1, 4, 1, 4, 4, generator=g).to(dtype),
        timestep=torch.tensor([3]).to(dtype),
        encoder_hidden_states=torch.randn(1, 5, 16, generator=g).to(dtype),
        encoder_attention_mask=torch.ones(1, 5).to(dtype),
        pooled_projections=torch.randn(1, 8, generator=g).to(dtype),
        guidance=torch.tensor([3.0]).to(dtype),
        return_dict=False,
    )


def _sa3():
    from diffusers.models.transformers.transformer_stable_audio3 import StableAudio3DiTModel

    return _randomize(
        StableAudio3DiTModel(
            io_channels=8,
            embed_dim=32,
            depth=1,
            num_heads=2,
            cond_token_dim=8,
            global_cond_dim=8,
            local_add_cond_dim=4,
            timestep_features_dim=16,
            num_memory_tokens=2,
        )
    )


def _sa3_inputs(dtype, inpaint=True):
    """Text-to-audio inputs, plus the inpainting pipeline's ``local_add_cond`` (``inpaint``)."""
    g = torch.Generator().manual_seed(5)
    kw = dict(
        hidden_states=torch.randn(1, 8, 6, generator=g).to(dtype),
        timestep=torch.tensor([0.3]).to(dtype),
        encoder_hidden_states=torch.randn(1, 3, 8, generator=g).to(dtype),
        global_hidden_states=torch.randn(1, 8, generator=g).to(dtype),
        local_add_cond=torch.randn(1, 4, 6, generator=g).to(dtype),
        return_dict=False,
    )
    if not inpaint:
        del kw["local_add_cond"]
    return kw


def _qwen(head_dim=16):
    from diffusers import QwenImageTransformer2DModel

    cfg = _at_head_dim(
        TINY_QWEN_IMAGE, head_dim, "axes_dims_rope", lambda d: (d // 2, d // 4, d // 4)
    )
    return _randomize(QwenImageTransformer2DModel(**cfg, patch_size=2, num_layers=1))


def _qwen_inputs(dtype):
    g = torch.Generator().manual_seed(6)
    return dict(
        hidden_states=torch.randn(1, 16, 16, generator=g).to(dtype),
        encoder_hidden_states=torch.randn(1, 7, 16, generator=g).to(dtype),
        encoder_hidden_states_mask=torch.ones(1, 7, dtype=torch.bool),
        timestep=torch.tensor([1.0]).to(dtype),
        img_shapes=[(1, 4, 4)],
        return_dict=False,
    )


CASES = [
    (
        "wan-t2v",
        lambda: _wan(),
        lambda dt: _wan_inputs(dt),
        {"attention processors (QK-norm + RoPE)": 4, "blocks (AdaLN)": 2},
    ),
    (
        "wan-i2v",
        lambda: _wan(i2v=True),
        lambda dt: _wan_inputs(dt, i2v=True),
        {"attention processors (QK-norm + RoPE)": 4, "blocks (AdaLN)": 2},
    ),
    (
        "wan-ti2v",
        lambda: _wan(),
        lambda dt: _wan_inputs(dt, per_token=True),
        {"attention processors (QK-norm + RoPE)": 4, "blocks (AdaLN)": 2},
    ),
    (
        "flux1",
        _flux,
        _flux_inputs,
        {
            "attention processors (QK-norm + RoPE)": 3,
            "AdaLayerNormZero (modulate)": 2,
            "AdaLayerNormZeroSingle (modulate)": 2,
            "blocks (gated residuals + norm2)": 1,
            "single blocks (gated residual, GELU into the concat buffer)": 2,
        },
    ),
    (
        "flux2",
        _flux2,
        lambda dt: _flux_inputs(dt, flux2=True),
        {
            "attention processors (QK-norm + RoPE)": 1,
            "single-stream processors (QK-norm + RoPE, SwiGLU into the concat buffer)": 1,
            "SwiGLU activations (one kernel)": 3,
            "blocks (AdaLN + gated residuals)": 1,
            "single blocks (AdaLN + gated residual)": 1,
        },
    ),
    (
        "hunyuan-video",
        _hunyuan,
        _hunyuan_inputs,
        {
            "attention processors (QK-norm + RoPE)": 2,
            "AdaLayerNormZero (modulate)": 2,
            "AdaLayerNormZeroSingle (modulate)": 1,
            "blocks (gated residuals + norm2)": 1,
            "single blocks (gated residual, GELU into the concat buffer)": 1,
        },
    ),
    (
        "sa3-dit",
        _sa3,
        lambda dt: _sa3_inputs(dt, inpaint=False),
        {"attention processors (QK-norm + RoPE)": 1, "blocks (AdaLN + gated residuals)": 1},
    ),
    (
        "sa3-dit-inpaint",
        _sa3,
        _sa3_inputs,
        {"attention processors (QK-norm + RoPE)": 1, "blocks (AdaLN + gated residuals)": 1},
    ),
    (
        "qwen-image",
        _qwen,
        _qwen_inputs,
        {"attention processors (QK-norm + RoPE)": 1, "blocks (AdaLN + gated residuals)": 1},
    ),
]


#: the families ``patch(attention="fp8")`` puts on 8-bit attention, at head_dim 64 (the
#: 8-bit kernel takes 64 and 128): (name, make, inputs, 8-bit attention calls a forward --
#: every patched processor once; Wan I2V's cross-attention twice, text and image keys)
FP8_CASES = [
    ("wan-t2v", lambda: _wan(head_dim=64), lambda dt: _wan_inputs(dt), 4),
    (
        "wan-i2v",
        lambda: _wan(i2v=True, head_dim=64),
        lambda dt: _wan_inputs(dt, i2v=True, text=512),
        6,
    ),
    ("flux1", lambda: _flux(head_dim=64), _flux_inputs, 3),
    ("flux2", lambda: _flux2(head_dim=64), lambda dt: _flux_inputs(dt, flux2=True), 2),
    ("hunyuan-video", lambda: _hunyuan(head_dim=64), _hunyuan_inputs, 2),
    ("qwen-image", lambda: _qwen(head_dim=64), _qwen_inputs, 1),
]


def close(out, ref, dtype):
    """(max |out - ref|, output scale, share of bitwise-equal elements)."""
    scale = ref.float().abs().max().item()
    err = (out.float() - ref.float()).abs().max().item()
    return err, scale, (out == ref).float().mean().item()


def _same():
    from diffusers import AutoencoderSAME

    return _randomize(
        AutoencoderSAME(
            audio_channels=2,
            patch_size=4,
            encoder_channels=32,
            encoder_c_mults=(2,),
            encoder_strides=(2,),
            encoder_transformer_depths=(1,),
            latent_dim=8,
            dim_heads=32,
            ff_mult=1,
            sliding_window=1,
        )
    )


def _same_inputs(dtype):
    g = torch.Generator().manual_seed(7)
    return dict(sample=torch.randn(1, 2, 48, generator=g).to(dtype), return_dict=False)


# ---------------------------------------------------------------------------------------
# VAEs (``patch(..., vae=True)``: their norm -> SiLU pairs): (name, make, latent shape, image
# / video shape, fused pairs: 2 a ResNet block + the encoder's and decoder's heads)


#: AutoencoderKL's tiny layout (FLUX.2's VAE takes the same arguments)
_KL = dict(
    block_out_channels=(16, 32),
    down_block_types=("DownEncoderBlock2D",) * 2,
    up_block_types=("UpDecoderBlock2D",) * 2,
    norm_num_groups=8,
    latent_channels=4,
)
#: Wan 2.1's tiny VAE layout (Qwen-Image's VAE is Wan's)
_WAN_VAE = dict(
    base_dim=8,
    z_dim=4,
    dim_mult=[1, 2],
    num_res_blocks=1,
    temperal_downsample=[False],
    latents_mean=[0.0] * 4,
    latents_std=[1.0] * 4,
)


def _vae_kl():
    from diffusers import AutoencoderKL

    return AutoencoderKL(**_KL)


def _vae_flux2():
    import inspect

    from diffusers import AutoencoderKLFlux2

    sig = inspect.signature(AutoencoderKLFlux2.__init__).parameters
    return AutoencoderKLFlux2(**{k: v for k, v in _KL.items() if k in sig})


def _vae_hunyuan():
    from diffusers import AutoencoderKLHunyuanVideo

    return AutoencoderKLHunyuanVideo(
        latent_channels=4,
        down_block_types=("HunyuanVideoDownBlock3D",) * 2,
        up_block_types=("HunyuanVideoUpBlock3D",) * 2,
        block_out_channels=(8, 16),
        layers_per_block=1,
        norm_num_groups=4,
        spatial_compression_ratio=2,
        temporal_compression_ratio=4,
    )


def _vae_wan():
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(**_WAN_VAE)


def _vae_wan22():
    """Wan 2.2's residual VAE layout (patchified input, average-pool shortcuts)."""
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan(
        **{**_WAN_VAE, "dim_mult": [1, 2, 2], "temperal_downsample": [False, True]},
        decoder_base_dim=8,
        is_residual=True,
        patch_size=2,
        in_channels=12,
        out_channels=12,
    )


def _vae_qwen():
    from diffusers import AutoencoderKLQwenImage

    return AutoencoderKLQwenImage(**_WAN_VAE)


VAE_CASES = [
    ("kl", _vae_kl, (1, 4, 8, 8), (1, 3, 16, 16), 22),
    ("flux2", _vae_flux2, (1, 4, 8, 8), (1, 3, 16, 16), 30),
    ("hunyuan", _vae_hunyuan, (1, 4, 2, 8, 8), (1, 3, 5, 16, 16), 22),
    ("wan", _vae_wan, (1, 4, 2, 8, 8), (1, 3, 2, 16, 16), 22),
    ("wan22", _vae_wan22, (1, 4, 2, 4, 4), (1, 3, 5, 32, 32), 28),
    ("qwen", _vae_qwen, (1, 4, 1, 8, 8), (1, 3, 1, 16, 16), 22),
]


def vae_inputs(zshape, xshape, dtype, seed=1):
    """Latents to decode and an image / video to encode (random, seeded)."""
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(zshape, generator=g).to(dtype),
        (torch.rand(xshape, generator=g) * 2 - 1).to(dtype),
    )
