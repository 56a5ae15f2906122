"""VAE decode with ``ditfuse.patch`` (the norm -> SiLU pairs on the kernels) against the
unpatched VAE. Default-initialised VAEs of the production configurations (no
downloads: the time does not depend on the weights), CUDA events, median of 5 after 2
warm-ups, torch.no_grad; each patched output compared with the unpatched one.

    PYTHONPATH=src python benchmarks/vae_e2e.py [--compile] [case ...]

Cases: flux-1024 (FLUX.1's AutoencoderKL, 1024^2, bf16), wan-480p-9f (Wan 2.1's VAE, 480p,
3 latent frames -> 9 frames, bf16 and fp32 -- Wan's pipelines run the VAE in fp32),
hunyuan-256-9f (HunyuanVideo's VAE, 256^2, 3 latent frames), qwen-1328 (Qwen-Image's VAE,
1328^2, bf16). ``--compile``: also torch.compile of the decoder (inductor), unpatched and patched
(under compile the 4-D GroupNorm pairs stay on the kernel, channels-last; the 5-D VAEs' pairs
trace the modules' code). Results: docs/design/group_norm.md.
"""

import statistics
import sys

import torch

import ditfuse


def timed(fn, reps=5):
    for _ in range(2):
        fn()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def compiled_ms(vae, z):
    """Decode time with the decoder under torch.compile (inductor), the decoder restored."""
    dec = vae.decoder
    vae.decoder = torch.compile(dec)
    try:
        return timed(lambda: vae.decode(z))
    finally:
        vae.decoder = dec


def flux():
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        latent_channels=16,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(128, 256, 512, 512),
        layers_per_block=2,
        norm_num_groups=32,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )


def wan():
    from diffusers import AutoencoderKLWan

    return AutoencoderKLWan()


def hunyuan():
    from diffusers import AutoencoderKLHunyuanVideo

    return AutoencoderKLHunyuanVideo()


def qwen():
    from diffusers import AutoencoderKLQwenImage

    return AutoencoderKLQwenImage()


CASES = {  # name: (builder, latent shape, dtypes)
    "flux-1024": (flux, (1, 16, 128, 128), (torch.bfloat16,)),
    "wan-480p-9f": (wan, (1, 16, 3, 60, 104), (torch.bfloat16, torch.float32)),
    "hunyuan-256-9f": (hunyuan, (1, 16, 3, 32, 32), (torch.bfloat16,)),
    "qwen-1328": (qwen, (1, 16, 1, 166, 166), (torch.bfloat16,)),
}


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    for name in args or list(CASES):
        build, zshape, dtypes = CASES[name]
        for dt in dtypes:
            torch.manual_seed(0)
            vae = build().to("cuda", dt).eval()
            if hasattr(vae, "disable_tiling"):
                vae.disable_tiling()
            z = torch.randn(zshape, device="cuda", dtype=dt)
            with torch.no_grad():
                ref = vae.decode(z).sample
                t0 = timed(lambda: vae.decode(z))
                tc = compiled_ms(vae, z) if "--compile" in sys.argv else None
                r = ditfuse.patch(vae)
                out = vae.decode(z).sample
                t1 = timed(lambda: vae.decode(z))
                tcp = compiled_ms(vae, z) if "--compile" in sys.argv else None
            err = (out.float() - ref.float()).abs().max().item()
            scale = ref.float().abs().max().item()
            line = (
                f"{name:15s} {str(dt):15s} out {tuple(out.shape)}  unpatched {t0:8.2f} ms  patched "
                f"{t1:8.2f} ms  ({t0 / t1:.2f}x)"
            )
            if "--compile" in sys.argv:
                line += f"  compiled: unpatched {tc:8.2f} ms, patched {tcp:8.2f} ms"
            print(f"{line}  max|d| {err:.3g} of {scale:.3g}  {r.counts}", flush=True)
            vae = z = ref = out = None  # free before the next case
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
