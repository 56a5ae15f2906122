"""``ditfuse bench --e2e``: whole models with ditfuse patched in.

Transformers (Wan 2.1 14B, FLUX.1-dev, FLUX.2-dev): real-size configs with random weights
(no downloads), cut to a few blocks (the count is printed), one denoising step timed four
ways -- unpatched eager, unpatched ``torch.compile``, patched eager, patched + compile --
with steps run back to back as a pipeline's loop runs them (:func:`loop_timer`); then a
20-step Euler trajectory patched vs unpatched (PSNR and max |diff| of the final latents,
on the "patched eager" row). ``wan14b-720p`` runs only when named (``--models``).

``--fp8`` (:func:`run_model` with ``fp8``): the 8-bit attention rows of Wan 2.1 14B at 480p
and 720p, HunyuanVideo and FLUX.2 -- unpatched, ``ditfuse.patch`` and
``ditfuse.patch(attention="fp8")``, each under ``torch.compile``: a step's time, the speed-up
over unpatched + compile, and each one's 20-step trajectory against the unpatched eager one
(``e2e-fp8-<gpu>-<date>.csv``).

SAME-L (``AutoencoderSAME``, Stable Audio 3's autoencoder) at full size: ``decode`` of 1 and
3 minutes of latents, unpatched (diffusers' dense (N, N) band mask) vs patched
(``ditfuse.sliding_window_attention``), in bf16 (what the diffusers pipeline runs with
``torch_dtype=bf16``) and fp32; an out-of-memory shows as ``OOM`` in its row. Each row has
the peak of ``torch.cuda.max_memory_allocated`` (weights included).

Models are built as ``from_pretrained(torch_dtype=...)`` leaves them (``_keep_in_fp32_modules``
and non-persistent buffers such as RoPE tables stay fp32), directly on the device, and fed
the inputs their diffusers 0.42 pipelines build (dtypes and shapes of ids, timesteps,
guidance). Rows print as they finish and the CSV is rewritten after every row.
"""

from __future__ import annotations

import copy
import csv
import gc
import math
import os
import re
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from ditfuse.tools import tiny_models as tiny
from ditfuse.tools.kernel_profile import format_split, time_by_class
from ditfuse.tools.tiny_models import to_dtype as as_loaded  # from_pretrained(torch_dtype=...)

# ---------------------------------------------------------------------------------------
# Model configs (diffusers 0.42 class arguments of the released checkpoints)

WAN14B = {
    "patch_size": (1, 2, 2),
    "num_attention_heads": 40,
    "attention_head_dim": 128,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": 4096,
    "freq_dim": 256,
    "ffn_dim": 13824,
    "num_layers": 40,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "eps": 1e-6,
    "rope_max_seq_len": 1024,
}
FLUX1_DEV = {
    "patch_size": 1,
    "in_channels": 64,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "pooled_projection_dim": 768,
    "guidance_embeds": True,
    "axes_dims_rope": (16, 56, 56),
}
FLUX2_DEV = {
    "patch_size": 1,
    "in_channels": 128,
    "num_layers": 8,
    "num_single_layers": 48,
    "attention_head_dim": 128,
    "num_attention_heads": 48,
    "joint_attention_dim": 15360,
    "timestep_guidance_channels": 256,
    "mlp_ratio": 3.0,
    "axes_dims_rope": (32, 32, 32, 32),
    "rope_theta": 2000,
    "eps": 1e-6,
    "guidance_embeds": True,
}
QWEN_IMAGE = {
    "patch_size": 2,
    "in_channels": 64,
    "out_channels": 16,
    "num_layers": 60,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 3584,
    "guidance_embeds": False,
    "axes_dims_rope": (16, 56, 56),
}
HUNYUAN_VIDEO = {
    "in_channels": 16,
    "out_channels": 16,
    "num_attention_heads": 24,
    "attention_head_dim": 128,
    "num_layers": 20,
    "num_single_layers": 40,
    "num_refiner_layers": 2,
    "mlp_ratio": 4.0,
    "patch_size": 2,
    "patch_size_t": 1,
    "qk_norm": "rms_norm",
    "guidance_embeds": True,
    "text_embed_dim": 4096,
    "pooled_projection_dim": 768,
    "rope_theta": 256.0,
    "rope_axes_dim": (16, 56, 56),
}
# SAME-L (stabilityai/SAME-L, SA3 Medium's VAE): 852 M parameters; decoder: one resampling
# block, stride 16, 12 layers of 1536 = 24 heads x 64, band half-width 1 x 17 tokens.
SAME_L = {
    "audio_channels": 2,
    "patch_size": 256,
    "encoder_channels": 256,
    "encoder_c_mults": (6,),
    "encoder_strides": (16,),
    "encoder_transformer_depths": (12,),
    "latent_dim": 256,
    "use_differential_attention": True,
    "dim_heads": 64,
    "ff_mult": 3,
    "sliding_window": 1,
    "encoder_sinusoidal_blocks": (0,),
    "decoder_sinusoidal_blocks": (8,),
    "sampling_rate": 44100,
}

ROW_FIELDS = [
    "model",
    "impl",
    "dtype",
    "blocks",
    "ms",
    "ms_per_block",
    "peak_gib",
    "psnr",
    "max_abs_diff",
    "shape",
    "note",
    "speedup",
]


def _randomize(m: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter N(0, 1 / last_dim), drawn on the parameters' device."""
    dev = next(m.parameters()).device
    g = torch.Generator(device=dev).manual_seed(seed)
    for p in m.parameters():
        p.data.copy_(
            torch.randn(p.shape, generator=g, device=dev) * (1.0 / math.sqrt(max(p.shape[-1], 1)))
        )
    return m.eval()


def _randomize_same(m: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """SAME with random weights that behave like trained ones: weights N(0, 1/fan_in), the
    residual branches' output projections (zero-initialised in diffusers: ``attn.to_out``,
    ``ff.proj_out``) at 0.3 of that, the learned output tokens N(0, 1), biases N(0, 0.02^2);
    the DyT norms (alpha 4, gamma 1, beta 0) and the weight-norm gains keep their init.

    Why: with ``_randomize``'s tiny DyT gammas the logits are ~0 and attention uniform (a
    weak comparison); with full-scale branches the 12-layer decoder with sin-gated FFNs is
    chaotic (a 1e-3 change in layer 0's attention moves the output by ~50%, PSNR ~19 dB), so
    any rounding difference would look like a bug. At 0.3 the same change costs ~77 dB while
    dropping attention altogether costs ~19 dB: attention matters and rounding stays rounding."""
    from diffusers.models.autoencoders.autoencoder_same import DynamicTanh

    keep = {id(p) for mod in m.modules() if isinstance(mod, DynamicTanh) for p in mod.parameters()}
    dev = next(m.parameters()).device
    g = torch.Generator(device=dev).manual_seed(seed)
    for name, p in m.named_parameters():
        if id(p) in keep or name.endswith("weight_g"):
            continue
        if name.endswith("new_tokens"):
            std = 1.0
        elif p.ndim >= 2:
            std = 1.0 / math.sqrt(max(p[0].numel(), 1))
            if name.endswith(("attn.to_out.weight", "ff.proj_out.weight")):
                std *= 0.3
        else:
            std = 0.02
        p.data.copy_(torch.randn(p.shape, generator=g, device=dev) * std)
    return m.eval()


# ---------------------------------------------------------------------------------------
# Builders: (layers, **config overrides) -> model with its default init. Input builders:
# (device, dtype, cfg=<model config>, **sizes) -> the kwargs the diffusers pipeline passes.


def _wan14b(layers: int, **config):
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(**{**WAN14B, "num_layers": layers, **config})


def _wan_inputs(device, dtype, frames=21, h=60, w=104, text_len=512, cfg=None):
    """WanPipeline: fp32 latents passed as ``latents.to(transformer.dtype)``, umT5 embeddings
    padded to 512 tokens in the transformer dtype, ``timestep = t.expand(B)`` with ``t`` from
    its UniPC scheduler (int64). 480x832x81 frames: latents 21 x 60 x 104."""
    cfg = WAN14B if cfg is None else cfg
    g = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(1, cfg["in_channels"], frames, h, w, generator=g, device=device)
    e = torch.randn(1, text_len, cfg["text_dim"], generator=g, device=device)
    return {
        "hidden_states": x.to(dtype),
        "encoder_hidden_states": e.to(dtype),
        "timestep": torch.tensor([500], dtype=torch.int64, device=device),
        "return_dict": False,
    }


def _grid(h, w):
    """(h*w,) row and column indices (int64), row-major, as the pipelines lay out tokens."""
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    return rows.reshape(-1), cols.reshape(-1)


def _flux1(layers: int, **config):
    from diffusers import FluxTransformer2DModel

    return FluxTransformer2DModel(
        **{**FLUX1_DEV, "num_layers": layers, "num_single_layers": 2 * layers, **config}
    )


def _flux1_inputs(device, dtype, height=64, width=64, text_len=512, cfg=None):
    """FluxPipeline (1024x1024: 64 x 64 packed latents): ``img_ids`` (h*w, 3) = (0, row, col)
    and ``txt_ids`` zeros (T, 3), both in the text encoders' dtype; ``timestep = t / 1000``
    in the latents' dtype; ``guidance`` fp32 (B,)."""
    cfg = FLUX1_DEV if cfg is None else cfg
    g = torch.Generator(device=device).manual_seed(2)
    rows, cols = _grid(height, width)
    img_ids = torch.stack([torch.zeros_like(rows), rows, cols], -1).to(device=device, dtype=dtype)
    x = torch.randn(1, height * width, cfg["in_channels"], generator=g, device=device)
    e = torch.randn(1, text_len, cfg["joint_attention_dim"], generator=g, device=device)
    pooled = torch.randn(1, cfg["pooled_projection_dim"], generator=g, device=device)
    kw = {
        "hidden_states": x.to(dtype),
        "encoder_hidden_states": e.to(dtype),
        "pooled_projections": pooled.to(dtype),
        "timestep": torch.tensor([0.5], device=device).to(dtype),
        "img_ids": img_ids,
        "txt_ids": torch.zeros(text_len, 3, device=device, dtype=dtype),
        "return_dict": False,
    }
    if cfg["guidance_embeds"]:
        kw["guidance"] = torch.full([1], 3.5, dtype=torch.float32, device=device)
    return kw


def _flux2(layers: int, **config):
    from diffusers import Flux2Transformer2DModel

    return Flux2Transformer2DModel(
        **{**FLUX2_DEV, "num_layers": layers, "num_single_layers": 2 * layers, **config}
    )


def _flux2_inputs(device, dtype, height=64, width=64, text_len=512, cfg=None):
    """Flux2Pipeline (1024x1024: 64 x 64 packed latents): int64 ids (B, L, 4) over the axes
    (t, h, w, l): image tokens (0, row, col, 0), text tokens (0, 0, 0, index); Mistral
    embeddings (3 layers stacked: 15360) in the model dtype; ``timestep = t / 1000`` in the
    latents' dtype; ``guidance`` fp32 (B,)."""
    cfg = FLUX2_DEV if cfg is None else cfg
    g = torch.Generator(device=device).manual_seed(3)
    rows, cols = _grid(height, width)
    zeros = torch.zeros_like(rows)
    img_ids = torch.stack([zeros, rows, cols, zeros], -1)[None].to(device)
    tok = torch.arange(text_len)
    txt_ids = torch.stack([torch.zeros_like(tok)] * 3 + [tok], -1)[None].to(device)
    x = torch.randn(1, height * width, cfg["in_channels"], generator=g, device=device)
    e = torch.randn(1, text_len, cfg["joint_attention_dim"], generator=g, device=device)
    kw = {
        "hidden_states": x.to(dtype),
        "encoder_hidden_states": e.to(dtype),
        "timestep": torch.tensor([0.5], device=device).to(dtype),
        "img_ids": img_ids,
        "txt_ids": txt_ids,
        "return_dict": False,
    }
    if cfg["guidance_embeds"]:
        kw["guidance"] = torch.full([1], 4.0, dtype=torch.float32, device=device)
    return kw


def _qwen_image(layers: int, **config):
    from diffusers import QwenImageTransformer2DModel

    return QwenImageTransformer2DModel(**{**QWEN_IMAGE, "num_layers": layers, **config})


def _qwen_image_inputs(device, dtype, height=83, width=83, text_len=512, cfg=None):
    """QwenImagePipeline (1328x1328: 83 x 83 packed latents): latents and Qwen2.5-VL prompt
    embeddings in the model dtype, the mask dropped (``prompt_embeds_mask.all()``: one
    unpadded prompt), ``timestep = t / 1000`` in the latents' dtype, ``img_shapes`` one list
    of (frames, h, w) per sample. Text: the registry's 512 tokens (the pipeline's maximum)."""
    cfg = QWEN_IMAGE if cfg is None else cfg
    g = torch.Generator(device=device).manual_seed(4)
    x = torch.randn(1, height * width, cfg["in_channels"], generator=g, device=device)
    e = torch.randn(1, text_len, cfg["joint_attention_dim"], generator=g, device=device)
    return {
        "hidden_states": x.to(dtype),
        "encoder_hidden_states": e.to(dtype),
        "encoder_hidden_states_mask": None,
        "timestep": torch.tensor([0.5], device=device).to(dtype),
        "img_shapes": [[(1, height, width)]],
        "return_dict": False,
    }


def _hunyuan_video(layers: int, **config):
    from diffusers import HunyuanVideoTransformer3DModel

    return HunyuanVideoTransformer3DModel(
        **{**HUNYUAN_VIDEO, "num_layers": layers, "num_single_layers": 2 * layers, **config}
    )


def _hunyuan_video_inputs(device, dtype, frames=16, h=68, w=120, text_len=256, prompt=80, cfg=None):
    """HunyuanVideoPipeline (544x960, 61 frames: latents 16 x 68 x 120): fp32 latents passed
    as ``latents.to(transformer_dtype)``, ``timestep`` fp32 (0..1000), llama embeddings of
    256 tokens of which the first ``prompt`` are the prompt (mask in the model dtype, the
    rest padding), CLIP's pooled embedding, ``guidance = 6.0 * 1000`` in the model dtype."""
    cfg = HUNYUAN_VIDEO if cfg is None else cfg
    g = torch.Generator(device=device).manual_seed(5)
    x = torch.randn(1, cfg["in_channels"], frames, h, w, generator=g, device=device)
    e = torch.randn(1, text_len, cfg["text_embed_dim"], generator=g, device=device)
    pooled = torch.randn(1, cfg["pooled_projection_dim"], generator=g, device=device)
    mask = torch.zeros(1, text_len, device=device)
    mask[:, : min(prompt, text_len)] = 1
    return {
        "hidden_states": x.to(dtype),
        "timestep": torch.tensor([500.0], device=device),
        "encoder_hidden_states": e.to(dtype),
        "encoder_attention_mask": mask.to(dtype),
        "pooled_projections": pooled.to(dtype),
        "guidance": torch.tensor([6.0], device=device).to(dtype) * 1000.0,
        "return_dict": False,
    }


def _same(layers: int = 0, **config):
    """The whole AutoencoderSAME (encoder too, as loaded); ``layers`` is ignored: full depth."""
    from diffusers import AutoencoderSAME

    return AutoencoderSAME(**{**SAME_L, **config})


def same_latent_count(seconds: float, cfg) -> int:
    """Latents StableAudio3Pipeline makes for ``seconds`` of audio (no silence padding)."""
    ratio = cfg["patch_size"] * math.prod(cfg["encoder_strides"])
    return math.ceil(seconds * cfg["sampling_rate"] / ratio)


def _same_inputs(device, dtype, latents=646, cfg=None):
    """StableAudio3Pipeline decodes ``vae.decode(latents)`` with latents (B, latent_dim, T) in
    the pipeline dtype (that of the prompt embeddings): the VAE runs in ``torch_dtype``."""
    cfg = SAME_L if cfg is None else cfg
    g = torch.Generator(device=device).manual_seed(7)
    return {
        "latents": torch.randn(1, cfg["latent_dim"], latents, generator=g, device=device).to(dtype)
    }


@dataclass
class E2EModel:
    name: str
    build: Callable[..., torch.nn.Module]  # (layers, **config overrides) -> model
    inputs: Callable[..., dict]  # (device, dtype, cfg=model.config, **sizes) -> kwargs
    latent_key: str = "hidden_states"  # the kwarg the trajectory integrates
    time_key: str = "timestep"
    time_scale: float = 1000.0  # timestep = t * time_scale
    sizes: dict = field(default_factory=dict)  # the GPU run's input sizes
    tiny_config: dict = field(default_factory=dict)  # CPU test: config overrides ...
    tiny_sizes: dict = field(default_factory=dict)  # ... and input sizes (same builders)
    kind: str = "transformer"  # "transformer" | "vae-decode"
    randomize: Callable = _randomize
    dtypes: tuple = (torch.bfloat16,)
    in_all: bool = True  # run by ``--models all``; else only when named


def _image_model(name, build, inputs, tiny_config, text_len: int = 8) -> E2EModel:
    """An image transformer's entry: timestep ``t`` (not ``1000 t``), a 4 x 4 latent grid and
    ``text_len`` prompt tokens in the CPU test."""
    tiny_sizes = {"height": 4, "width": 4, "text_len": text_len}
    return E2EModel(
        name, build, inputs, time_scale=1.0, tiny_config=tiny_config, tiny_sizes=tiny_sizes
    )


_WAN14B_480P = E2EModel(
    "wan14b-480p",
    _wan14b,
    _wan_inputs,
    tiny_config=tiny.TINY_WAN,
    tiny_sizes={"frames": 1, "h": 8, "w": 8, "text_len": 6},
)

E2E_MODELS: dict[str, E2EModel] = {
    m.name: m
    for m in [
        _WAN14B_480P,
        # 720x1280, 81 frames: latents 21 x 90 x 160, 75600 tokens a block's self-attention
        replace(
            _WAN14B_480P,
            name="wan14b-720p",
            sizes={"frames": 21, "h": 90, "w": 160},
            in_all=False,
            tiny_sizes={"frames": 1, "h": 8, "w": 6, "text_len": 6},
        ),
        _image_model("flux1-1024", _flux1, _flux1_inputs, tiny.TINY_FLUX1),
        _image_model("flux2-1024", _flux2, _flux2_inputs, tiny.TINY_FLUX2),
        _image_model("qwen-image-1328", _qwen_image, _qwen_image_inputs, tiny.TINY_QWEN_IMAGE, 7),
        E2EModel(
            "hunyuan-video-544p",
            _hunyuan_video,
            _hunyuan_video_inputs,
            tiny_config=tiny.TINY_HUNYUAN_VIDEO,
            tiny_sizes={"frames": 2, "h": 4, "w": 4, "text_len": 6, "prompt": 4},
        ),
        E2EModel(
            "same-l",
            _same,
            _same_inputs,
            latent_key="latents",
            kind="vae-decode",
            randomize=_randomize_same,
            dtypes=(torch.bfloat16, torch.float32),
            sizes={"seconds": (60, 180)},
            tiny_config={
                "patch_size": 4,
                "encoder_channels": 32,
                "encoder_c_mults": (2,),
                "encoder_strides": (2,),
                "encoder_transformer_depths": (2,),
                "latent_dim": 8,
                "dim_heads": 32,
                "ff_mult": 1,
                "decoder_sinusoidal_blocks": (1,),
            },
            tiny_sizes={"latents": (4, 9)},
        ),
    ]
}


def build_model(spec: E2EModel, layers: int, device, dtype, seed: int = 0, **config):
    """``spec.build`` on ``device`` (no host-side init of billions of parameters), random
    weights, cast as ``from_pretrained(torch_dtype=dtype)`` would."""
    with torch.device(device):
        model = spec.build(layers, **config)
    spec.randomize(model, seed)
    return as_loaded(model, dtype).eval().requires_grad_(False)


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    mse = (a - b).pow(2).mean().item()
    peak = b.abs().max().item()
    return float("inf") if mse == 0 else 10 * math.log10(peak * peak / mse)


def _compare(out, ref) -> dict:
    return {
        "psnr": psnr(out, ref),
        "max_abs_diff": (out.double() - ref.double()).abs().max().item(),
    }


@torch.no_grad()
def trajectory(model, kw: dict, spec: E2EModel, steps: int = 20) -> torch.Tensor:
    """A flow-matching Euler trajectory x <- x + dt * v(x, t) from t = 1 to 0."""
    x = kw[spec.latent_key].clone()
    t_dtype = kw[spec.time_key].dtype
    for i in range(steps):
        t = 1.0 - i / steps
        args = dict(
            kw,
            **{
                spec.latent_key: x,
                spec.time_key: torch.full_like(
                    kw[spec.time_key], t * spec.time_scale, dtype=t_dtype
                ),
            },
        )
        v = model(**args)[0]
        x = (x.float() - v.float() / steps).to(x.dtype)
    return x


class CudaMemory:
    """Peak-memory probe of one row: ``reset()`` before, ``peak()`` (GiB) after;
    ``above()``: the peak over what was allocated at ``reset()`` (GiB), the memory a call
    adds to the tensors that stay (weights, inputs, other models)."""

    base = 0

    def reset(self):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self.base = torch.cuda.memory_allocated()

    def peak(self) -> float:
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() / 2**30

    def above(self) -> float:
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - self.base) / 2**30


def device_weights_gib(model: torch.nn.Module, device) -> float:
    """GiB of ``model``'s parameters and buffers on ``device``, each storage once (what the
    model holds there: FP8 linears count their e4m3 weights and scales, not the 16-bit
    weights they keep on the host)."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    seen, total = set(), 0
    dev = torch.device(device)
    todo = list(model.parameters()) + list(model.buffers())
    while todo:
        t = todo.pop()
        if t.device.type != dev.type:
            continue
        if is_traceable_wrapper_subclass(t):  # e.g. torchao's float8 weights: their parts
            todo.extend(getattr(t, name) for name in t.__tensor_flatten__()[0])
            continue
        st = t.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            total += st.nbytes()
    return total / 2**30


def _row(spec, impl, dtype, **kw) -> dict:
    r = dict.fromkeys(ROW_FIELDS)
    r.update(model=spec.name, impl=impl, dtype=str(dtype).replace("torch.", ""), **kw)
    return r


def _timed_rows(spec, dtype, blocks, shape):
    """The row maker of one model's timed ways: ``row(impl, ms, peak_gib, **columns)``, with
    the model's blocks and shape and the time per block (None where ``ms`` is)."""

    def row(impl, ms, peak_gib, **columns):
        per_block = None if ms is None else ms / max(blocks, 1)
        return _row(
            spec,
            impl,
            dtype,
            blocks=blocks,
            ms=ms,
            ms_per_block=per_block,
            peak_gib=peak_gib,
            shape=shape,
            **columns,
        )

    return row


def _model_and_inputs(spec, layers, device, dtype, config, sizes):
    """:func:`build_model` and its inputs (``spec.sizes`` unless ``sizes``), with the rows'
    block count and shape column."""
    model = build_model(spec, layers, device, dtype, **(config or {}))
    kw = spec.inputs(device, dtype, cfg=model.config, **(spec.sizes if sizes is None else sizes))
    blocks = sum(1 for m in model.modules() if type(m).__name__.endswith("TransformerBlock"))
    lat, txt = kw[spec.latent_key], kw.get("encoder_hidden_states")
    shape = f"latents {tuple(lat.shape)}" + (f" + text {txt.shape[1]}" if txt is not None else "")
    return model, kw, blocks, shape


def _interleaved(fns: dict, rounds: int, timer, mem=None, peak=None):
    """``timer`` of each of ``fns`` in ``rounds`` rounds over all of them, so that the GPU's
    clock (it drifts down as the chip heats over a run) weighs on each the same: per impl,
    the times (ms), the host times (``timer.host_ms``) and, with ``mem`` (reset before each
    call), ``peak(impl)`` after each call (else None)."""
    times, hosts, peaks = ({impl: [] for impl in fns} for _ in range(3))
    for _ in range(rounds):
        for impl, fn in fns.items():
            if mem:
                mem.reset()
            times[impl].append(timer(fn))
            hosts[impl].append(getattr(timer, "host_ms", None))
            peaks[impl].append(peak(impl) if mem else None)
    return times, hosts, peaks


def _spread(times, hosts) -> str:
    """A row's rounds in its note: each round's ms, and its host ms where the timer gives it."""
    out = "rounds " + "/".join(f"{t:.2f}" for t in times)
    if all(h is not None for h in hosts):
        out += ", host " + "/".join(f"{h:.2f}" for h in hosts)
    return out


def run_model(
    spec: E2EModel,
    device: str,
    dtype: torch.dtype,
    layers: int,
    timer,
    emit,
    compile_backend: str | None = "inductor",
    steps: int = 20,
    config=None,
    sizes=None,
    mem=None,
    rounds: int = 3,
    fp8: bool = False,
    patch_8bit=None,
    ways=None,
    progress=None,
    kernels=None,
):
    """Time one step of ``spec``'s model on copies of it, in ``rounds`` interleaved rounds,
    and compare ``steps``-step trajectories against the unpatched eager one in ``dtype``
    (PSNR and max |diff| of the final latents); calls ``emit(row)`` for each way.

    Without ``fp8``, four ways (two without ``compile_backend``): an unpatched model and a
    ``ditfuse.patch`` copy, each eager and under ``torch.compile``; the patched eager
    trajectory is compared. Returns (rows {impl: ms}, quality, the patch report).

    ``fp8``: three ways, each under ``torch.compile`` (``compile_backend``; eager where None):
    unpatched (the baseline), ``ditfuse.patch`` (exact) and
    ``ditfuse.patch(attention="fp8")`` (``patch_8bit``, default :func:`patch_fp8`), with the
    speed-up over the baseline and each one's trajectory (the compiled callable). ``ways``:
    (label, patch) pairs instead of the exact and 8-bit patches (:func:`linear_fp8_ways`).
    ``mem`` (:class:`CudaMemory`): a row's peak GiB is its copy's weights on the device plus
    a step's peak above the resting memory (the copies all stay resident). ``progress``:
    called with a line as each way is ready. ``kernels``: a callable of ``fn`` giving (name,
    us) of each kernel of one call (:func:`ditfuse.tools.kernel_profile.profiled_kernels`):
    each row's note then ends with that call's kernel time by class, after the timing rounds.
    Returns (rows {impl: ms}, quality {impl: {psnr, max_abs_diff}}, the patch reports)."""
    import ditfuse

    if fp8:
        ways = ways or [("patched", ditfuse.patch), ("patched fp8", patch_8bit or patch_fp8)]
        modes = [" compile" if compile_backend else " eager"]
    else:
        ways = [("patched", ditfuse.patch)]
        modes = [" eager", " compile"] if compile_backend else [" eager"]
    progress = progress or (lambda line: None)
    model, kw, blocks, shape = _model_and_inputs(spec, layers, device, dtype, config, sizes)
    row = _timed_rows(spec, dtype, blocks, shape)
    rows, quality, trajs, fns, weights = {}, {}, {}, {}, {}
    limit = torch._dynamo.config.cache_size_limit
    torch._dynamo.reset()
    # instances of one class share the forward's code: room for every instance's graph, so
    # that none falls back to eager
    torch._dynamo.config.cache_size_limit = max(limit, 64)
    try:
        with torch.no_grad():
            ref = trajectory(model, kw, spec, steps)  # unpatched eager: the reference
            copies = [(label, copy.deepcopy(model)) for label, _ in ways]
            reports = tuple(fn(m) for (_, fn), (_, m) in zip(ways, copies))
            for name, m in [("unpatched", model)] + copies:
                for impl in (name + mode for mode in modes):
                    weights[impl] = device_weights_gib(m, device)
                    fn = m
                    t0 = time.time()
                    if impl.endswith(" compile"):
                        fn = torch.compile(m, backend=compile_backend)
                        fn(**kw)  # compiles
                    progress(f"  {impl}: ready in {time.time() - t0:.0f} s")
                    if fp8 or impl == "patched eager":
                        trajs[impl] = trajectory(fn, kw, spec, steps)
                        quality[impl] = _compare(trajs[impl], ref)
                    fns[impl] = lambda fn=fn: fn(**kw)
            # with fp8 every way's copy stays resident: its own weights plus what a step adds
            peak_of = (lambda impl: weights[impl] + mem.above()) if fp8 else lambda impl: mem.peak()
            times, hosts, peaks = _interleaved(fns, rounds, timer, mem, peak_of)
            for impl in fns:  # a row is the median of its rounds
                rows[impl] = statistics.median(times[impl])
            splits = {impl: time_by_class(kernels(fns[impl])) for impl in fns} if kernels else {}
            for impl in fns:
                note = _spread(times[impl], hosts[impl])
                if impl in quality:
                    what = f" eager {str(dtype).replace('torch.', '')}" if fp8 else ""
                    note = f"{steps}-step trajectory vs unpatched{what}; {note}"
                if fp8 and mem:
                    note += (
                        f"; peak GiB = the model's weights on the GPU "
                        f"({weights[impl]:.3f}) + a step's peak above the resting memory"
                    )
                if (
                    impl.startswith("patched fp8")
                    and "patched" + modes[0] in trajs
                    and torch.equal(trajs[impl], trajs["patched" + modes[0]])
                ):
                    note += (
                        "; WARNING: trajectory equal to the exact patch's (no 8-bit attention ran)"
                    )
                if impl in splits:
                    note += "; " + format_split(splits[impl])
                extra = dict(speedup=rows[next(iter(fns))] / rows[impl]) if fp8 else {}
                peak = max(peaks[impl]) if mem else None
                emit(row(impl, rows[impl], peak, note=note, **extra, **quality.get(impl, {})))
    finally:
        torch._dynamo.config.cache_size_limit = limit
        torch._dynamo.reset()
    if fp8:
        return rows, quality, reports
    return rows, quality["patched eager"], reports[0]


# ---------------------------------------------------------------------------------------
# 8-bit attention end to end (``ditfuse bench --e2e --fp8``)

#: the models the 8-bit rows run by default, quickest first (a cut-short run keeps rows)
FP8_MODELS = ("flux2-1024", "wan14b-480p", "hunyuan-video-544p", "wan14b-720p")
#: their double-stream blocks (FLUX.2 / HunyuanVideo: + 2x single-stream), unless --layers
FP8_LAYERS = {"wan14b-480p": 4, "wan14b-720p": 4, "flux2-1024": 1, "hunyuan-video-544p": 1}


def fp8_patch_missing() -> str | None:
    """Why this ditfuse's ``patch`` cannot install 8-bit attention, or None when it can: its
    ``attention`` a plain bool ("fp8" would read as True and install the exact path without
    a word)."""
    import inspect

    import ditfuse

    sig = inspect.signature(ditfuse.patch)
    param = sig.parameters.get("attention")
    if param is None or (
        param.annotation in (bool, "bool") and "fp8" not in (ditfuse.patch.__doc__ or "")
    ):
        return (
            f"ditfuse.patch(model, attention='fp8') is not available in this ditfuse "
            f"(patch{sig}): the 8-bit attention rows need it"
        )
    return None


def patch_fp8(model):
    """``ditfuse.patch(model, attention="fp8")``, or a RuntimeError saying why not."""
    import ditfuse

    missing = fp8_patch_missing()
    if missing:
        raise RuntimeError(missing)
    try:
        return ditfuse.patch(model, attention="fp8")
    except (TypeError, ValueError) as e:
        raise RuntimeError(f"ditfuse.patch(model, attention='fp8') failed: {e}") from e


def linear_fp8_ways(labels=None):
    """The ways of ``ditfuse bench --e2e --fp8 --linear-fp8``: (label, patch) after the
    unpatched baseline -- the exact patch, 8-bit attention, FP8 linears, both, torchao's
    float8 dynamic per-row linears (the peer) on the model's block linears, and ditfuse's 8-bit
    attention with torchao's linears (what a user stacking the two runs: the linears' margin
    where the attention is already fast); ``labels``: only those, in this order (a ValueError
    names an unknown one)."""
    import ditfuse

    def torchao_linears(model):
        from torchao.quantization import (
            Float8DynamicActivationFloat8WeightConfig,
            PerRow,
            quantize_,
        )

        def block_linear(mod, fqn):
            return (
                isinstance(mod, torch.nn.Linear)
                and "blocks" in fqn.split(".", 1)[0]
                and not any(p in fqn for p in ("norm", "img_mod", "txt_mod", "emb"))
            )

        quantize_(
            model,
            Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()),
            filter_fn=block_linear,
        )
        return "torchao float8 dynamic per-row block linears"

    def attention_fp8_torchao_linears(model):
        report = ditfuse.patch(model, attention="fp8")
        return f"{report}; {torchao_linears(model)}"

    ways = [
        ("patched", ditfuse.patch),
        ("patched fp8", lambda m: ditfuse.patch(m, attention="fp8")),
        ("patched linear-fp8", lambda m: ditfuse.patch(m, linear="fp8")),
        ("patched fp8 + linear-fp8", lambda m: ditfuse.patch(m, attention="fp8", linear="fp8")),
        ("torchao linear-fp8", torchao_linears),
        ("patched fp8 + torchao linear-fp8", attention_fp8_torchao_linears),
    ]
    if labels is None:
        return ways
    unknown = [w for w in labels if w not in dict(ways)]
    if unknown or not labels:
        raise ValueError(f"ways: unknown {unknown}; known: {', '.join(w for w, _ in ways)}")
    return [w for w in ways if w[0] in labels]


def _oom_note(err: BaseException) -> str:
    m = re.search(r"Tried to allocate ([0-9.]+ [KMGT]?i?B)", str(err))
    return "OOM" + (f" (tried to allocate {m.group(1)})" if m else "")


def _free(device):
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()


def _decode_once(model, latents, timer, mem, single_call_s=3.0):
    """(output of a first decode, ms, peak GiB, note). The first call is the warm-up (Triton
    JIT) and the compared output; ``timer`` then times more calls, unless the first took over
    ``single_call_s`` (given for the unpatched rows only: the dense-mask path at 3 minutes, no
    JIT in its first call): then that one call is the time, to keep the run bounded. An
    out-of-memory gives (None, None, peak, "OOM ...")."""
    note, out, ms = None, None, None
    cuda = latents.is_cuda
    if mem:
        mem.reset()
    try:
        with torch.no_grad():
            t0 = time.perf_counter()
            out = model.decode(latents).sample
            if cuda:
                torch.cuda.synchronize()
            first_s = time.perf_counter() - t0
            if single_call_s is not None and first_s > single_call_s:
                ms, note = first_s * 1e3, "one call (no warm-up)"
            else:
                ms = timer(lambda: model.decode(latents).sample)
    except torch.cuda.OutOfMemoryError as e:  # torch.OutOfMemoryError
        note, out, ms = _oom_note(e), None, None
    peak = mem.peak() if mem else None
    if out is None:
        _free(latents.device)
    return out, ms, peak, note


def run_same(
    spec: E2EModel,
    device: str,
    timer,
    emit,
    dtypes=None,
    config=None,
    sizes=None,
    mem=None,
    single_call_s=3.0,
):
    """SAME ``decode`` of each length, unpatched then patched, per dtype (the same random
    weights for every dtype); the patched row carries PSNR / max |diff| against the
    unpatched output. An out-of-memory (the dense-mask path at 3 minutes) becomes an ``OOM``
    row. Returns {(dtype, latents): {impl: ms or None}}."""
    import ditfuse

    results, kept = {}, {}
    sizes = spec.sizes if sizes is None else sizes
    dtypes = tuple(dtypes or spec.dtypes)
    for dtype in dtypes:
        model = build_model(spec, 0, device, dtype, **(config or {}))
        cfg = model.config
        lengths = list(
            sizes.get("latents") or [same_latent_count(s, cfg) for s in sizes["seconds"]]
        )
        first = model.decoder.blocks[0]  # SAME-S/L: the only decoder block
        blocks = sum(len(b.transformers) for b in model.decoder.blocks)
        ratio = cfg["patch_size"] * math.prod(cfg["encoder_strides"])
        for n in lengths:
            latents = spec.inputs(device, dtype, latents=n, cfg=cfg)["latents"]
            shape = (
                f"{n * ratio / cfg['sampling_rate']:.3g} s: {n} latents, "
                f"{n * (first.stride + 1)} tokens, "
                f"window {first.sliding_window * (first.stride + 1)}"
            )
            outs, res = {}, {}
            for impl in ("unpatched", "patched"):
                if impl == "patched":
                    ditfuse.patch(model)
                try:
                    out, ms, peak, note = _decode_once(
                        model, latents, timer, mem, single_call_s if impl == "unpatched" else None
                    )
                finally:
                    if impl == "patched":
                        ditfuse.unpatch(model)
                outs[impl], res[impl] = out, ms
                if out is not None and torch.float32 in dtypes:
                    kept[(dtype, n, impl)] = out
                quality = (
                    _compare(out, outs["unpatched"])
                    if impl == "patched" and out is not None and outs["unpatched"] is not None
                    else {}
                )
                emit(_timed_rows(spec, dtype, blocks, shape)(impl, ms, peak, note=note, **quality))
            results[(dtype, n)] = res
            outs = latents = out = None
            _free(device)
        model = first = None
        _free(device)
    _emit_vs_fp32(spec, kept, dtypes, emit)
    return results


def _emit_vs_fp32(spec, kept, dtypes, emit):
    """Both lower-precision decodes against the fp32 one (unpatched, or patched where that
    one ran out of memory): what rounding alone costs, the scale for the patched-vs-
    unpatched PSNR of that dtype."""
    for n in sorted({k[1] for k in kept}):
        ref_impl = next(
            (i for i in ("unpatched", "patched") if (torch.float32, n, i) in kept), None
        )
        if ref_impl is None:
            continue
        ref = kept[(torch.float32, n, ref_impl)]
        for dtype in dtypes:
            for impl in ("unpatched", "patched"):
                if dtype != torch.float32 and (dtype, n, impl) in kept:
                    emit(
                        _row(
                            spec,
                            f"{impl} vs fp32",
                            dtype,
                            shape=f"{n} latents",
                            note=f"reference: fp32 {ref_impl}",
                            **_compare(kept[(dtype, n, impl)], ref),
                        )
                    )


def loop_timer(
    min_ms: float = 2000.0, settle_ms: float = 500.0, warmup: int = 2, min_steps: int = 3
):
    """ms a step of ``fn`` run back to back, as a denoising loop runs its steps: warm-up
    calls (at least ``warmup``, for at least ``settle_ms``), then n calls (at least
    ``min_steps``, enough for ``min_ms``) launched one after the other, one sync at the end;
    ``timer.host_ms`` is the host time of the first timed step (its launches, from an empty
    queue: over seconds of steps the host waits on the full launch queue, so the loop's own
    host time says nothing). The host prepares a step while the GPU runs the one before, so
    a step's host cost counts only where it exceeds its GPU time.

    Why seconds, not a few steps: a GPU at its power limit sets its SM clock by the load, and
    a denser way (compiled: fewer gaps between kernels) draws more and clocks lower; after
    ``settle_ms`` of its own load and over ``min_ms`` a way runs at its own clock, as a
    pipeline's 20-50 steps do, not at the one the previous way left
    (docs/design/end_to_end.md)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def timer(fn):
        t = time.perf_counter()
        done = 0
        while done < warmup or (time.perf_counter() - t) * 1e3 < settle_ms:
            fn()
            done += 1
            sync()
        est = (time.perf_counter() - t) / done * 1e3
        n = max(min_steps, math.ceil(min_ms / max(est, 1e-3)))
        t = time.perf_counter()
        fn()
        timer.host_ms = (time.perf_counter() - t) * 1e3  # one step's launches, queue empty
        for _ in range(n - 1):
            fn()
        sync()
        return (time.perf_counter() - t) / n * 1e3

    timer.host_ms = None
    return timer


def adaptive_timer(budget_s: float = 2.0, max_reps: int = 10):
    """Median ms of ``fn`` over as many calls as fit in ``budget_s`` (at least one, at most
    ``max_reps``), for rows of seconds each; the caller has made a warm-up call."""

    def timer(fn):
        times = []
        while True:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
            if len(times) >= max_reps or sum(times) + times[-1] > budget_s * 1e3:
                return statistics.median(times)

    return timer


def format_row(r: dict) -> str:
    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    ms = "OOM" if r["ms"] is None and (r["note"] or "").startswith("OOM") else num(r["ms"], ".2f")
    sp = r.get("speedup")
    speedup = "" if sp is None else f"  x{format(sp, '.3f')} vs baseline"
    return (
        f"{r['model']:12s} {r['impl']:20s} {r['dtype']:8s} {num(r['blocks'], 'd'):>6s} {ms:>10s} "
        f"{num(r['ms_per_block'], '.2f'):>9s} {num(r['peak_gib'], '.2f'):>8s} "
        f"{num(r['psnr'], '.1f'):>7s} "
        f"{num(r['max_abs_diff'], '.3g'):>9s}  {r['shape'] or ''}"
        f"{speedup}"
        f"{'  ' + r['note'] if r['note'] else ''}"
    )


HEADER = (
    f"{'model':12s} {'impl':20s} {'dtype':8s} {'blocks':>6s} {'ms':>10s} {'ms/block':>9s} "
    f"{'peak GiB':>8s} {'PSNR':>7s} {'max|d|':>9s}  shape / note"
)


def write_csv(path: str, rows, fields=ROW_FIELDS) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def read_rows(path: str, fields=ROW_FIELDS) -> list:
    """The rows an earlier call wrote to ``path`` (a day's CSV of one GPU), kept ahead of a new
    call's; none where the file is absent or has other columns."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        r = csv.DictReader(f)
        return list(r) if r.fieldnames == list(fields) else []


def run_e2e(
    names,
    device: str,
    layers,
    csv_path: str,
    timer,
    slow_timer,
    mem=None,
    compile_backend: str | None = "inductor",
    steps: int = 20,
    tiny: bool = False,
    out=sys.stdout,
    rounds: int = 3,
    fp8: bool = False,
    linear: bool = False,
    ways=None,
    kernels=None,
) -> int:
    """Every model in ``names`` in turn: rows printed (flushed) and the CSV rewritten as each
    row finishes; a model that fails is reported and the next one runs. ``tiny``: the CPU
    test's configs and sizes through the same builders. ``layers``: a count, or a count per
    model name. ``fp8``: :func:`run_model`'s three 8-bit ways instead of the four (transformers
    only). ``kernels``: :func:`run_model`'s, for the transformers' step rows. Rows already in
    ``csv_path`` (an earlier call the same day) are kept ahead of this call's. Returns the
    number of failures."""
    rows, failed = [], 0
    earlier = read_rows(csv_path)

    def emit(r):
        rows.append(r)
        print(format_row(r), file=out, flush=True)
        write_csv(csv_path, earlier + rows)

    print(HEADER, file=out, flush=True)
    for n in names:
        spec = E2E_MODELS[n]
        t0 = time.time()
        kw = {"config": spec.tiny_config, "sizes": spec.tiny_sizes} if tiny else {}
        n_layers = layers[n] if isinstance(layers, dict) else layers
        # a transformer's step run (run_model)
        step = (spec, device, torch.bfloat16, n_layers, timer, emit)
        options = dict(
            compile_backend=compile_backend,
            steps=steps,
            mem=mem,
            rounds=rounds,
            kernels=kernels,
            **kw,
        )
        try:
            if fp8:
                if spec.kind != "transformer":
                    print(
                        f"  {n}: no 8-bit attention rows (not a transformer)", file=out, flush=True
                    )
                    continue
                chosen = linear_fp8_ways(ways) if linear else None
                _, _, reports = run_model(
                    *step,
                    fp8=True,
                    ways=chosen,
                    progress=lambda line: print(line, file=out, flush=True),
                    **options,
                )
                labels = (
                    [w[0] for w in chosen]
                    if chosen
                    else ["ditfuse.patch", "ditfuse.patch(attention='fp8')"]
                )
                for label, rep in zip(labels, reports):
                    print(f"  {label}: {rep}", file=out, flush=True)
            elif spec.kind == "vae-decode":
                run_same(spec, device, slow_timer, emit, mem=mem, **kw)
            else:
                _, _, report = run_model(*step, **options)
                print(f"  ditfuse.patch: {report}", file=out, flush=True)
        except Exception:  # noqa: BLE001 -- report it, keep the other models' rows
            failed += 1
            print(f"{n}: FAILED\n{traceback.format_exc()}", file=out, flush=True)
        torch._dynamo.reset()  # compiled graphs hold the model
        _free(device)
        print(f"  {n}: {time.time() - t0:.0f} s", file=out, flush=True)
    return failed


def models_to_run(arg: str, default: list, prog: str, transformers_only: bool = False):
    """The models ``--models`` names (``all``: ``default``); None, with the reason printed to
    stderr, where one is not in :data:`E2E_MODELS` (or not a transformer) or there is no GPU."""
    names = default if arg == "all" else [n.strip() for n in arg.split(",") if n.strip()]
    known = [n for n, s in E2E_MODELS.items() if s.kind == "transformer" or not transformers_only]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        what = "unknown or not a transformer" if transformers_only else "unknown"
        print(f"{prog}: {what} model(s) {unknown}; known: {','.join(known)}", file=sys.stderr)
        return None
    if not torch.cuda.is_available():
        print(f"{prog}: no CUDA GPU here", file=sys.stderr)
        return None
    return names


def main(args) -> int:
    """Called by ``ditfuse bench --e2e`` (``--fp8``: the 8-bit attention rows)."""
    import datetime as _dt

    import triton

    from ditfuse.tools.kernel_profile import profiled_kernels

    fp8 = getattr(args, "fp8", False)
    linear = getattr(args, "linear_fp8", False)
    if linear and not fp8:
        print("ditfuse bench --e2e: --linear-fp8 goes with --fp8", file=sys.stderr)
        return 2
    ways = getattr(args, "ways", None)
    if ways is not None:
        if not linear:
            print("ditfuse bench --e2e: --ways goes with --fp8 --linear-fp8", file=sys.stderr)
            return 2
        ways = [w.strip() for w in ways.split(",") if w.strip()]
        try:
            linear_fp8_ways(ways)
        except ValueError as e:
            print(f"ditfuse bench --e2e: --{e}", file=sys.stderr)
            return 2
    default = list(FP8_MODELS) if fp8 else [n for n, s in E2E_MODELS.items() if s.in_all]
    names = models_to_run(args.models, default, "ditfuse bench --e2e")
    if names is None:
        return 2
    if fp8 and fp8_patch_missing():
        print(f"ditfuse bench --e2e --fp8: {fp8_patch_missing()}", file=sys.stderr)
        return 2
    compile_backend = None if getattr(args, "no_compile", False) else "inductor"
    layers = getattr(args, "layers", None)
    if layers is None:
        layers = {n: FP8_LAYERS.get(n, 2) for n in names} if fp8 else 2
    rounds = getattr(args, "rounds", None) or (2 if fp8 else 5)
    steps = getattr(args, "steps", 20)
    blocks = (
        ", ".join(f"{n} {v}" for n, v in layers.items())
        if isinstance(layers, dict)
        else str(layers)
    )
    if linear:
        what = (
            f"FP8: unpatched, {', '.join(w[0] for w in linear_fp8_ways(ways))}"
            f"{', each under torch.compile' if compile_backend else ' (eager)'}; {steps}-step "
            f"trajectories against unpatched eager bf16; {rounds} timing rounds"
        )
    elif fp8:
        what = (
            f"8-bit attention: unpatched, patched, patched with attention='fp8'"
            f"{', each under torch.compile' if compile_backend else ' (eager)'}; {steps}-step "
            f"trajectories against unpatched eager bf16; {rounds} timing rounds"
        )
    else:
        what = (
            f"{'' if compile_backend else 'no compile rows; '}SAME-L: full size, decode, bf16 "
            f"and fp32; "
            f"peak GiB includes the weights"
        )
    print(
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
        f"{triton.__version__}; random weights. Transformers: bf16, double-stream blocks "
        f"{blocks} (FLUX, HunyuanVideo: + 2x single). "
        f"{what}.",
        flush=True,
    )
    out_dir = getattr(args, "out_dir", None) or "benchmarks/results"
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(
        out_dir,
        f"e2e{'-fp8' if fp8 else ''}{'-linear' if linear else ''}-"
        f"{torch.cuda.get_device_name().replace(' ', '-')}-"
        f"{_dt.date.today().isoformat()}.csv",
    )
    t0 = time.time()
    failed = run_e2e(
        names,
        "cuda",
        layers,
        path,
        timer=loop_timer(),  # ms a step, per round
        slow_timer=adaptive_timer(),
        mem=CudaMemory(),
        compile_backend=compile_backend,
        rounds=rounds,
        steps=steps,
        fp8=fp8,
        linear=linear,
        ways=ways,
        kernels=profiled_kernels if getattr(args, "kernels", False) else None,
    )
    print(f"csv: {path} ({time.time() - t0:.0f} s)", flush=True)
    return 1 if failed else 0
