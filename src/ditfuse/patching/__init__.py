"""``ditfuse.patch``: install fused processors and blocks into diffusers models.

A table maps each model class to the function that patches its modules. Every patch is
per module (a processor instance replaced, a ``forward`` bound on an instance), recorded
on the module so :func:`unpatch` restores exactly what was there. Nothing global (no
``F.scaled_dot_product_attention`` monkey-patch).
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from ditfuse.patching.common import (
    _ORIG_PROC,
    _PATCHED_FWD,
    FP8,
    FP8_LABEL,
    HOOKED,  # noqa: F401 (re-exported: patch reports count under it)
    PatchReport,
    check_attention,
    min_keys_8bit,
)
from ditfuse.patching.linear_fp8 import (
    DEFAULT_EXCLUDE,
    LINEAR_FP8,
    check_linear,
    patch_linears,
    unpatch_linears,
)
from ditfuse.patching.registry import FP8_CLASSES, VAE_CLASSES, model_patches


def _models(obj):
    if isinstance(obj, torch.nn.Module):
        return [("model", obj)]
    comps = getattr(obj, "components", None)
    if isinstance(comps, dict):
        return [(k, v) for k, v in comps.items() if isinstance(v, torch.nn.Module)]
    raise TypeError(f"patch() takes a diffusers model or pipeline, got {type(obj).__name__}")


def patch(
    obj,
    *,
    qk_norm_rope: bool = True,
    adaln: bool = True,
    attention: Union[bool, str] = True,
    activations: bool = True,
    vae: bool = True,
    linear: Optional[str] = None,
    linear_exclude: Tuple[str, ...] = DEFAULT_EXCLUDE,
) -> PatchReport:
    """Install ditfuse's fused kernels into a diffusers model or pipeline, in place.

    Parameters
    ----------
    obj : torch.nn.Module or DiffusionPipeline
        A model (``WanTransformer3DModel``, ``FluxTransformer2DModel``,
        ``Flux2Transformer2DModel``, ``Flux3Transformer2DModel``,
        ``HunyuanVideoTransformer3DModel``,
        ``StableAudio3DiTModel``, ``QwenImageTransformer2DModel``,
        ``QwenImage21Transformer2DModel`` (its attention processors only),
        ``AutoencoderSAME``; and
        the models built from their attention and blocks: ``WanVACETransformer3DModel``,
        ``WanAnimateTransformer3DModel``, ``WanAnimate2Transformer3DModel`` (its reference
        KV-cache modes; RoPE within one rounding of its fp64 ``rope_apply``),
        ``ChronoEditTransformer3DModel``, ``ChromaTransformer2DModel``,
        ``HunyuanVideoFramepackTransformer3DModel``, ``HunyuanVideo15Transformer3DModel``,
        ``SkyReelsV2Transformer3DModel``), a VAE (``AutoencoderKL``,
        ``AutoencoderKLFlux2``, ``AutoencoderKLHunyuanVideo``, ``AutoencoderKLWan``,
        ``AutoencoderKLQwenImage``) or a pipeline, in which every component of a known class
        is patched (Wan 2.2's ``transformer`` and ``transformer_2`` both, and the ``vae``).
    qk_norm_rope, adaln, activations : bool
    attention : bool or "fp8"
        Which fusions to install. ``qk_norm_rope``: the attention processors' QK-norm + RoPE
        as one kernel. ``adaln``: the blocks' norm + modulate and gated-residual chains as
        the AdaLN kernels (Wan: norm1 + modulate, gated residual + norm2, residual + norm3
        + modulate, the FFN residual; FLUX.1 / HunyuanVideo: AdaLayerNormZero(Single), the
        gated residual + norm2 + modulate and the FF residuals; FLUX.2 / Qwen-Image: every
        norm + modulate and gated residual of both streams; FLUX.3: the per-token norm +
        modulate of every block (the joint blocks' streams into the rows of the joint
        sequence) and its gated residuals; the SA3 DiT: its RMS norms + modulate and gated
        residuals). ``attention``: the SAME autoencoder's band attention on
        ``sliding_window_attention`` (no dense mask); ``"fp8"``: that, and the DiT
        attention processors that ``qk_norm_rope`` installs (Wan 2.x and its variants,
        FLUX.1 / Chroma, FLUX.2, HunyuanVideo / FramePack / 1.5, Qwen-Image) on 8-bit
        attention: the QK-norm + RoPE kernel writes Q / K and
        ``ditfuse.attention(..., precision="fp8")`` attends them -- on an sm_90 GPU 16-bit
        Q / K to the warp-specialized kernel (with a key-padding mask, the kept keys
        compacted on the device), under Triton's interpreter int8 Q / K with per-token
        scales from the QK kernel (``common.qk_8bit``) -- where the kernel takes the
        call (no mask that masks anything but padded keys, head_dim 64 / 128, a 16-bit
        model, no context parallelism, an sm_90 GPU or the CPU interpreter) and, on a GPU,
        the call attends at least ``common.EIGHT_BIT_MIN_KEYS`` keys (12,288: below that
        cuDNN's bf16 attention measured faster; ``common.eight_bit_min_keys`` overrides);
        elsewhere the exact 16-bit path (docs/patching.md, "8-bit attention"). Needs
        ``qk_norm_rope=True``.
        ``activations``: the MLP activations
        as one kernel, written straight into the concat buffer the output projection reads
        (FLUX.2: every ``Flux2SwiGLU``, and in the single-stream processor, which
        ``qk_norm_rope`` installs; FLUX.3: every ``Flux3SwiGLU``; FLUX.1: the single-stream
        blocks' GELU, in the block forward that ``adaln`` installs).
    linear : None or "fp8"
        ``"fp8"``: the transformer blocks' linear layers as FP8 GEMMs
        (``ditfuse.patching.linear_fp8``): e4m3 weights with a scale per output channel,
        quantized here (the 16-bit weights move to the CPU until :func:`unpatch`), e4m3
        activations with a scale per token, quantized by one pass before each GEMM (an
        FFN's tanh GELU in that pass); a row-wise scaled FP8 GEMM with the bias in its
        epilogue (ditfuse's persistent Triton kernel on sm_90, cuBLASLt's elsewhere).
        Needs a 16-bit model on an sm_89+ GPU (or the CPU: tests); elsewhere the layers
        stay exact, the report says why. Combines with ``attention="fp8"``.
    linear_exclude : tuple of str
        fnmatch patterns of block linears (names relative to the model) kept in 16 bits;
        the default keeps the modulation and embedding linears (``*norm*``, ``*img_mod*``,
        ``*txt_mod*``, ``*emb*``). The report names every block linear and its precision.
    vae : bool
        The VAEs' norm -> SiLU pairs (their ResNet blocks' and encoder / decoder heads'
        GroupNorm -> SiLU, Wan's and Qwen-Image's channel RMS norm -> SiLU) as one kernel
        each: ``group_norm_silu`` / ``rms_norm_silu_channels``, within one rounding of the
        two modules (``ditfuse.patching.vae``).

    Each fused forward / processor runs the original code instead when autograd needs
    gradients, or when a norm, dtype or input differs from what the kernels reproduce (its
    docstring says which), so a patched model never computes something else.

    Returns
    -------
    PatchReport
        One line per component: what was replaced, or why it was left untouched.

    Patching twice is harmless; :func:`unpatch` restores the original processors and
    forwards. Patch before ``enable_parallelism`` / ``torch.compile``, and before diffusers'
    hooks (``enable_cache``, group offloading, layerwise casting) or accelerate's CPU offload:
    those then wrap the fused forwards. A block whose forward is already hooked keeps it
    (its processors are still replaced), counted under :data:`HOOKED` in the report.
    """
    check_attention(attention)
    check_linear(linear)
    if isinstance(linear_exclude, str) or not all(isinstance(p, str) for p in linear_exclude):
        raise ValueError(
            f"linear_exclude must be a tuple of fnmatch patterns, got {linear_exclude!r}"
        )
    if attention == FP8 and not qk_norm_rope:
        raise ValueError(
            "attention='fp8' runs in the attention processors that "
            "qk_norm_rope=True installs (their kernel writes the 8-bit Q / K); "
            "got qk_norm_rope=False"
        )
    report = PatchReport()
    reg = model_patches()
    flags = dict(
        qk_norm_rope=qk_norm_rope, adaln=adaln, attention=attention, activations=activations
    )
    for name, model in _models(obj):
        cls = type(model).__name__
        if cls in VAE_CLASSES:
            if not vae:
                report.lines.append(f"{name}: {cls} left untouched (vae=False)")
                continue
            from ditfuse.patching.vae import patch_vae as fn

            kw = {}
        else:
            fn, kw = reg.get(cls), flags
        if fn is None:
            report.lines.append(
                f"{name}: {cls} left untouched (ditfuse has no patch for this class)"
            )
            continue
        before = dict(report.counts)
        fn(model, report, **kw)
        done = {k: v - before.get(k, 0) for k, v in report.counts.items() if v - before.get(k, 0)}
        what = ", ".join(f"{v} {k}" for k, v in done.items()) or "nothing new (already patched)"
        if attention == FP8 and cls not in FP8_CLASSES and cls not in VAE_CLASSES:
            what += " (attention='fp8': no 8-bit path for this class, its attention stays 16-bit)"
        elif any(k.endswith(FP8_LABEL) for k in done):
            what += (
                " (8-bit attention for calls with no mask or a key-padding mask, on a GPU "
                f"those of >= {min_keys_8bit()} keys; another mask that masks "
                "something, or fewer keys: exact)"
            )
        report.lines.append(f"{name}: {cls}: {what}")
        if linear == LINEAR_FP8:
            patch_linears(model, report, linear_exclude)
    return report


def unpatch(obj) -> int:
    """Restore every processor and forward that :func:`patch` replaced; returns how many."""
    n = 0
    for _, model in _models(obj):
        n += unpatch_linears(model)  # before the forwards: it gives the weights back
        for m in model.modules():
            if _ORIG_PROC in m.__dict__:
                m.processor = m.__dict__.pop(_ORIG_PROC)
                n += 1
            if m.__dict__.pop(_PATCHED_FWD, False):
                del m.__dict__["forward"]
                n += 1
    return n
