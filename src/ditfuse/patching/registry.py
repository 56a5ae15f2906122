"""Which function patches which diffusers model class (matched by class name, so diffusers is
imported only by the model modules, and only when a model is patched)."""

from __future__ import annotations


def model_patches() -> dict:
    """``{class name: patch function}`` of every transformer / autoencoder ditfuse patches."""
    from ditfuse.patching import flux as _flux
    from ditfuse.patching import flux2 as _flux2
    from ditfuse.patching import flux3 as _flux3
    from ditfuse.patching import hunyuan as _hunyuan
    from ditfuse.patching import qwen as _qwen
    from ditfuse.patching import sa3 as _sa3
    from ditfuse.patching import same as _same
    from ditfuse.patching import wan as _wan
    from ditfuse.patching import wan_animate2 as _wan_animate2

    return {
        "WanTransformer3DModel": _wan.patch_model,
        # Wan VACE: Wan's blocks and attention plus VACE blocks (their attention processors
        # are Wan's; their forwards are not replaced: the block tables match exact types)
        "WanVACETransformer3DModel": _wan.patch_model,
        "SkyReelsV2Transformer3DModel": _wan.patch_skyreels,
        # Wan 2.2 Animate: copies of Wan's processor, attention and block in its own module
        "WanAnimateTransformer3DModel": _wan.patch_animate,
        # ChronoEdit: copies of Wan's processor, attention and block (Wan 2.1 I2V 14B)
        "ChronoEditTransformer3DModel": _wan.patch_chronoedit,
        # Wan-Animate-2: Wan's block arithmetic, its own in-context (reference KV cache)
        # self-attention with fp64 complex RoPE, and cross-attention processors
        "WanAnimate2Transformer3DModel": _wan_animate2.patch_model,
        "FluxTransformer2DModel": _flux.patch_model,
        # Chroma: FLUX.1's attention and processor (QK-norm + RoPE), its own pruned-AdaLN
        # blocks (not replaced)
        "ChromaTransformer2DModel": _flux.patch_model,
        "Flux2Transformer2DModel": _flux2.patch_model,
        "Flux3Transformer2DModel": _flux3.patch_model,
        "HunyuanVideoTransformer3DModel": _hunyuan.patch_model,
        # FramePack: HunyuanVideo's blocks and attention over packed history latents
        "HunyuanVideoFramepackTransformer3DModel": _hunyuan.patch_model,
        "HunyuanVideo15Transformer3DModel": _hunyuan.patch_model_15,
        "StableAudio3DiTModel": _sa3.patch_model,
        "QwenImageTransformer2DModel": _qwen.patch_model,
        "QwenImage21Transformer2DModel": _qwen.patch_model_21,
        "AutoencoderSAME": _same.patch_model,
    }


#: VAEs whose norm -> SiLU pairs ``patch(..., vae=True)`` fuses (``_vae``): FLUX.1's and
#: FLUX.2's AutoencoderKL, HunyuanVideo's, Wan's and Qwen-Image's
VAE_CLASSES = (
    "AutoencoderKL",
    "AutoencoderKLFlux2",
    "AutoencoderKLHunyuanVideo",
    "AutoencoderKLWan",
    "AutoencoderKLQwenImage",
)


#: models whose attention processors have the 8-bit path of ``patch(attention="fp8")``
#: (the others keep 16-bit attention: FLUX.3, Qwen-Image 2.1, the SA3 DiT; SAME gets its
#: 16-bit band attention, as with ``attention=True``)
FP8_CLASSES = (
    "WanTransformer3DModel",
    "WanVACETransformer3DModel",
    "SkyReelsV2Transformer3DModel",
    "WanAnimateTransformer3DModel",
    "ChronoEditTransformer3DModel",
    "WanAnimate2Transformer3DModel",
    "FluxTransformer2DModel",
    "ChromaTransformer2DModel",
    "Flux2Transformer2DModel",
    "HunyuanVideoTransformer3DModel",
    "HunyuanVideoFramepackTransformer3DModel",
    "HunyuanVideo15Transformer3DModel",
    "QwenImageTransformer2DModel",
)
