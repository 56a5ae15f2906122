"""Wan-Animate-2 end to end on the GPU at the 14B model's widths (random weights, as
``from_pretrained(torch_dtype=bf16)`` leaves them, a few blocks): the reference pass
("extract") and a denoising pass against its cache ("cached": flex attention, so both
models run under ``compile_repeated_blocks`` with inductor, as the model's docstring asks),
unpatched against patched. Prints the two outputs' agreement and the cached step's time
(CUDA events over back-to-back steps, median of rounds).

    PYTHONPATH=src python benchmarks/wan_animate2_e2e.py [--layers=2] [--ref-frames=6] [--tiny]
"""

import copy
import statistics
import sys
import time

import torch
from wan_animate2_qk import arg  # this folder's script

import ditfuse
from ditfuse.tools.tiny_models import _randomize, to_dtype


def main():
    from diffusers.models.transformers import transformer_wan_animate_2 as ta

    tiny = "--tiny" in sys.argv
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    layers, F = arg("layers", 2), arg("ref-frames", 6)
    if tiny:
        cfg = dict(
            text_len=6,
            in_dim=8,
            dim=24,
            ffn_dim=32,
            freq_dim=16,
            text_dim=16,
            out_dim=4,
            num_heads=2,
        )
        C, Cc, lat_hw, area, T, clip_tokens = 4, 4, (4, 4), [32, 32], 5, 3
    else:  # the 14B checkpoint's widths; 480 x 832 video: 60 x 104 latents, 30 x 52 patch cells
        cfg = {}
        C, Cc, lat_hw, area, T, clip_tokens = 16, 20, (60, 104), [480, 832], 77, 257
    torch.manual_seed(0)
    with torch.device(dev):
        model = ta.WanAnimate2Transformer3DModel(num_layers=layers, **cfg)
    _randomize(model)
    model = to_dtype(model, torch.bfloat16).eval().requires_grad_(False)
    g = torch.Generator(device=dev).manual_seed(1)

    def r(*s):
        return torch.randn(*s, generator=g, device=dev).to(torch.bfloat16)

    txt, clip = r(T, model.config.text_dim), r(1, clip_tokens, 1280)
    h, w = lat_hw[0] // 2, lat_hw[1] // 2
    grid_ref = torch.tensor([[F, h, w]])
    extract = dict(
        hidden_states=[r(C, F, *lat_hw)],
        timestep=torch.tensor([900.0], device=dev),
        encoder_hidden_states=[txt],
        encoder_hidden_states_image=clip,
        condition_latents=[r(Cc, F, *lat_hw)],
        kv_cache_mode="extract",
        seq_len=F * h * w,
        offset_grid_sizes=grid_ref,
        return_dict=False,
    )
    cached = dict(
        hidden_states=[r(C, F + 1, *lat_hw)],
        timestep=torch.tensor([500.0], device=dev),
        encoder_hidden_states=[txt],
        encoder_hidden_states_image=clip,
        condition_latents=[r(Cc, F + 1, *lat_hw)],
        kv_cache_mode="cached",
        seq_len=(F + 1) * h * w,
        reference_grid_sizes=grid_ref,
        origin_len=4 * (F - 1),
        origin_area=area,
        return_dict=False,
    )
    patched = copy.deepcopy(model)
    print(
        f"{dev}: {layers} blocks, dim {model.config.dim}, "
        f"reference {F} x {h} x {w} = {F * h * w} tokens, "
        f"generation {(F + 1) * h * w}; {ditfuse.patch(patched)}",
        flush=True,
    )
    outs, times = {}, {}
    for name, m in (("unpatched", model), ("patched", patched)):
        torch._dynamo.reset()
        t0 = time.time()
        m.compile_repeated_blocks()
        cache = ta.WanAnimate2KVCache(layers)
        with torch.no_grad():
            m(kv_cache=cache, **extract)
            outs[name] = m(kv_cache=cache, **cached)[0][0].float()
            if dev == "cuda":
                torch.cuda.synchronize()
            print(
                f"  {name}: first extract + cached pass (compiling) {time.time() - t0:.0f} s",
                flush=True,
            )
            rounds = []
            for _ in range(3 if dev == "cuda" else 1):
                if dev == "cuda":
                    a, b = (
                        torch.cuda.Event(enable_timing=True),
                        torch.cuda.Event(enable_timing=True),
                    )
                    a.record()
                    for _ in range(5):
                        m(kv_cache=cache, **cached)
                    b.record()
                    torch.cuda.synchronize()
                    rounds.append(a.elapsed_time(b) / 5)
                else:
                    t1 = time.time()
                    m(kv_cache=cache, **cached)
                    rounds.append((time.time() - t1) * 1e3)
        times[name] = statistics.median(rounds)
        print(
            f"  {name}: cached pass {times[name]:.2f} ms "
            f"(rounds {', '.join(f'{t:.2f}' for t in rounds)})",
            flush=True,
        )
    a, b = outs["unpatched"], outs["patched"]
    mse = (a - b).pow(2).mean().item()
    psnr = 10 * torch.log10(a.abs().max() ** 2 / max(mse, 1e-30)).item()
    print(
        f"  outputs: max |d| {(a - b).abs().max().item():.3g} (scale {a.abs().max().item():.3g}), "
        f"PSNR {psnr:.1f} dB; cached pass patched / unpatched "
        f"{times['patched'] / times['unpatched']:.3f}"
    )


if __name__ == "__main__":
    main()
