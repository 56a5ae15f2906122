"""``ditfuse bench --e2e``: whole transformers with ditfuse patched in.

Real-size models built from their configs with random weights (no downloads), cut to a
few blocks where memory or time demands (the count is printed), one denoising step timed
four ways: unpatched eager, unpatched ``torch.compile``, patched eager, patched + compile;
then a 20-step Euler trajectory patched vs unpatched in bf16 (PSNR and max |diff| of the
final latents).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Dict

import torch


@dataclass
class E2EModel:
    name: str
    build: Callable[[int], torch.nn.Module]       # layers -> model (random weights)
    inputs: Callable[[str, torch.dtype], dict]    # device, dtype -> forward kwargs
    latent_key: str                                # the kwarg the trajectory integrates
    time_key: str = "timestep"
    time_scale: float = 1000.0                     # timestep = t * time_scale
    layers: int = 2


def _randomize(m: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    for p in m.parameters():
        p.data.copy_(torch.randn(p.shape, generator=g) * (1.0 / math.sqrt(max(p.shape[-1], 1))))
    return m.eval()


def _wan14b(layers: int):
    from diffusers import WanTransformer3DModel

    return WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16,
        out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=layers,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)


def _wan_inputs(device, dtype, frames=21, h=60, w=104):
    g = torch.Generator(device=device).manual_seed(1)
    return dict(hidden_states=torch.randn(1, 16, frames, h, w, generator=g, device=device).to(dtype),
                encoder_hidden_states=torch.randn(1, 512, 4096, generator=g, device=device).to(dtype),
                timestep=torch.tensor([500.0], device=device), return_dict=False)


def _flux1(layers: int):
    from diffusers import FluxTransformer2DModel

    return FluxTransformer2DModel(
        patch_size=1, in_channels=64, num_layers=layers, num_single_layers=2 * layers,
        attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
        pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=(16, 56, 56))


def _flux1_inputs(device, dtype, S=4096, T=512):
    g = torch.Generator(device=device).manual_seed(2)
    side = int(math.isqrt(S))
    img_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(side), torch.arange(side),
                                         indexing="ij"), -1).reshape(-1, 3).to(device)
    return dict(hidden_states=torch.randn(1, S, 64, generator=g, device=device).to(dtype),
                encoder_hidden_states=torch.randn(1, T, 4096, generator=g, device=device).to(dtype),
                pooled_projections=torch.randn(1, 768, generator=g, device=device).to(dtype),
                timestep=torch.tensor([0.5], device=device).to(dtype), img_ids=img_ids.float(),
                txt_ids=torch.zeros(T, 3, device=device),
                guidance=torch.tensor([3.5], device=device).to(dtype), return_dict=False)


def _flux2(layers: int):
    from diffusers import Flux2Transformer2DModel

    return Flux2Transformer2DModel(
        patch_size=1, in_channels=128, num_layers=layers, num_single_layers=2 * layers,
        attention_head_dim=128, num_attention_heads=48, joint_attention_dim=15360,
        axes_dims_rope=(32, 32, 32, 32))


def _flux2_inputs(device, dtype, S=4096, T=512):
    g = torch.Generator(device=device).manual_seed(3)
    side = int(math.isqrt(S))
    ij = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij"), -1)
    img_ids = torch.cat([torch.zeros(S, 2), ij.reshape(-1, 2).float()], -1)[None].to(device)
    return dict(hidden_states=torch.randn(1, S, 128, generator=g, device=device).to(dtype),
                encoder_hidden_states=torch.randn(1, T, 15360, generator=g, device=device).to(dtype),
                timestep=torch.tensor([0.5], device=device).to(dtype), img_ids=img_ids,
                txt_ids=torch.zeros(1, T, 4, device=device),
                guidance=torch.tensor([3.5], device=device).to(dtype), return_dict=False)


E2E_MODELS: Dict[str, E2EModel] = {m.name: m for m in [
    E2EModel("wan14b-480p", _wan14b, _wan_inputs, "hidden_states", time_scale=1000.0),
    E2EModel("flux1-1024", _flux1, _flux1_inputs, "hidden_states", time_scale=1.0),
    E2EModel("flux2-1024", _flux2, _flux2_inputs, "hidden_states", time_scale=1.0),
]}


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    mse = (a - b).pow(2).mean().item()
    peak = b.abs().max().item()
    return float("inf") if mse == 0 else 10 * math.log10(peak * peak / mse)


@torch.no_grad()
def trajectory(model, kw: dict, spec: E2EModel, steps: int = 20) -> torch.Tensor:
    """A flow-matching Euler trajectory x <- x + dt * v(x, t) from t = 1 to 0."""
    x = kw[spec.latent_key].clone()
    t_dtype = kw[spec.time_key].dtype
    for i in range(steps):
        t = 1.0 - i / steps
        args = dict(kw, **{spec.latent_key: x,
                           spec.time_key: torch.full_like(kw[spec.time_key], t * spec.time_scale,
                                                          dtype=t_dtype)})
        v = model(**args)[0]
        x = (x.float() - v.float() / steps).to(x.dtype)
    return x


def run_model(spec: E2EModel, device: str, dtype: torch.dtype, layers: int, timer, emit,
              compile_backend: str = "inductor", steps: int = 20, build=None, inputs=None):
    """Time one step four ways and compare trajectories; calls ``emit(row_dict)``."""
    import ditfuse

    build = build or spec.build
    inputs = inputs or spec.inputs
    model = _randomize(build(layers)).to(device, dtype)
    kw = inputs(device, dtype)
    blocks = sum(1 for m in model.modules() if type(m).__name__.endswith("TransformerBlock"))
    rows = {}

    def step(m):
        return lambda: m(**kw)

    with torch.no_grad():
        rows["unpatched eager"] = timer(step(model))
        torch._dynamo.reset()
        comp = torch.compile(model, backend=compile_backend)
        comp(**kw)
        rows["unpatched compile"] = timer(step(comp))
        ref_traj = trajectory(model, kw, spec, steps)
        report = ditfuse.patch(model)
        rows["patched eager"] = timer(step(model))
        torch._dynamo.reset()
        comp = torch.compile(model, backend=compile_backend)
        comp(**kw)
        rows["patched compile"] = timer(step(comp))
        traj = trajectory(model, kw, spec, steps)
        ditfuse.unpatch(model)
    quality = dict(psnr=psnr(traj, ref_traj),
                   max_abs_diff=(traj.double() - ref_traj.double()).abs().max().item())
    for impl, ms in rows.items():
        emit(dict(model=spec.name, impl=impl, layers=layers, blocks=blocks, ms=ms,
                  ms_per_block=ms / max(blocks, 1), **quality))
    return rows, quality, report


def main(args) -> int:
    """Called by ``ditfuse bench --e2e``."""
    import triton

    if not torch.cuda.is_available():
        import sys
        print("ditfuse bench --e2e: no CUDA GPU here", file=sys.stderr)
        return 2
    from .bench import _median_us

    def timer(fn):
        return _median_us(fn, warmup=5, rep=50) / 1e3  # ms

    names = list(E2E_MODELS) if args.models == "all" else args.models.split(",")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"bf16, random weights, {args.layers} double-stream blocks (FLUX: + 2x single)")
    print(f"{'model':14s} {'impl':18s} {'blocks':>6s} {'ms/step':>9s} {'ms/block':>9s} {'PSNR':>7s} {'max|d|':>8s}")
    out = []

    def emit(r):
        out.append(r)
        print(f"{r['model']:14s} {r['impl']:18s} {r['blocks']:6d} {r['ms']:9.2f} "
              f"{r['ms_per_block']:9.2f} {r['psnr']:7.1f} {r['max_abs_diff']:8.3g}", flush=True)

    t0 = time.time()
    for n in names:
        run_model(E2E_MODELS[n], "cuda", torch.bfloat16, args.layers, timer, emit)
        torch.cuda.empty_cache()
    import csv
    import datetime as _dt
    import os

    os.makedirs(args.out_dir, exist_ok=True)
    path = os.path.join(args.out_dir, f"e2e-{torch.cuda.get_device_name().replace(' ', '-')}-"
                                      f"{_dt.date.today().isoformat()}.csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(out[0]))
        w.writeheader()
        w.writerows(out)
    print(f"csv: {path} ({time.time() - t0:.0f} s)")
    return 0
