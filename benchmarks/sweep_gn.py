"""Launch-settings sweep for group_norm_silu / rms_norm_silu_channels on the GPU: the split
path's tile and statistics programs, the fit threshold, the RMS tile, at the VAE shapes
(bf16), CUDA-graph device time (L2 flushed by do_bench). Prints us and % of the floor of
``bench_group_norm`` (one read when a group fits, two when it does not, one write);
informs gn_settings() / rms_settings()."""
import math

import torch

import ditfuse
from ditfuse.bench import copy_ceiling_gbps, graph_us
from ditfuse.group_norm import gn_settings
from ditfuse.shapes import GN_SHAPES

GN_VARIANTS = [{}, {"tile": 2048}, {"tile": 8192}, {"stats_programs": 512}, {"stats_programs": 2048},
               {"tile": 8192, "stats_programs": 512}, {"fit_max": 32768}, {"fit_max": 65536}]
RMS_VARIANTS = [{}, {"tile": 4096}, {"tile": 16384}, {"min_bs": 32}, {"min_bs": 64}]
# session 5: longer contiguous runs per channel row (BS positions, the column in chunks)
RMS_LONG = [{}, {"min_bs": 128}, {"min_bs": 256}, {"min_bs": 512}, {"min_bs": 1024},
            {"min_bs": 256, "tile": 4096}, {"min_bs": 512, "tile": 4096},
            {"min_bs": 1024, "tile": 16384}]
# session 6: the one-launch split path (_gn_fused_kernel, LOST and removed: see NOTES.md)
# against the two-launch one, its lag / tile / warps; these settings no longer exist
GN_FUSED = [{}, {"fused": False}, {"lag_tiles": 0}, {"lag_tiles": 1024}, {"lag_tiles": 2048},
            {"tile": 4096}, {"tile": 4096, "lag_tiles": 1024}, {"warps": 16},
            {"tile": 16384, "warps": 16}]
# session 6: apply tiles larger than the statistics tiles (one merge of the partials per
# 32-64 KB instead of 16 KB), and larger tiles for both passes
GN_APPLY = [{}, {"apply_tile": 16384}, {"apply_tile": 16384, "apply_warps": 16},
            {"apply_tile": 32768, "apply_warps": 16}, {"apply_tile": 4096},
            {"tile": 16384}, {"tile": 16384, "apply_warps": 16}]
ceil = copy_ceiling_gbps()
print(f"copy ceiling {ceil:.0f} GB/s")
import sys  # noqa: E402

only_rms = "--rms" in sys.argv  # session 5: the RMS shapes with RMS_LONG
only_fused = "--fused" in sys.argv  # session 6: the GroupNorm shapes with GN_FUSED
only_apply = "--apply" in sys.argv  # session 6: the GroupNorm shapes with GN_APPLY
only_fused = only_fused or only_apply
for name, sh in GN_SHAPES.items():
    if only_rms and sh.op != "rms" or only_fused and sh.op != "gn":
        continue
    C = sh.shape[1]
    sp = math.prod(sh.shape[2:])
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(sh.shape, generator=g, device="cuda") * 2 + 0.5).to(torch.bfloat16)
    pshape = (C,) + (1,) * (len(sh.shape) - 2) if sh.op == "rms" else (C,)
    w = (torch.randn(pshape, generator=g, device="cuda") * 0.5 + 1).to(torch.bfloat16)
    b = (torch.randn(pshape, generator=g, device="cuda") * 0.2).to(torch.bfloat16)
    if sh.op == "rms":
        reads = 1
        variants = RMS_LONG if only_rms else RMS_VARIANTS
    else:
        reads = 1 if gn_settings(sh.shape[0], sh.groups, C // sh.groups, sp).path == "fit" else 2
        variants = GN_APPLY if only_apply else GN_FUSED if only_fused else GN_VARIANTS
    nbytes = (reads + 1) * x.numel() * 2
    ref = None
    res = []
    for v in variants:
        def f(v=v, x=x, w=w, b=b, sh=sh):
            if sh.op == "rms":
                return ditfuse.rms_norm_silu_channels(x, w, None, 1e-12, _launch=v or None)
            return ditfuse.group_norm_silu(x, sh.groups, w, b, 1e-6, _launch=v or None)
        try:
            out = f()
            same = ref is None or torch.equal(out, ref)
            ref = out if ref is None else ref
            us = graph_us(f)
        except Exception as e:  # noqa: BLE001
            print(f"{name} {v}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        pct = 100 * nbytes / (us * 1e-6) / 1e9 / ceil
        res.append((us, str(v), pct))
        print(f"{name:20s} {v!s:44} {us:8.1f} us {pct:6.1f}% of floor "
              f"{'bitwise = default' if same else 'DIFFERS from default'}", flush=True)
    if only_rms or only_fused:  # torch.compile of the models' eager code, same timer
        import torch.nn.functional as F

        def eager(x=x, w=w, b=b, C=C, sh=sh):
            if sh.op == "gn":
                return F.silu(F.group_norm(x, sh.groups, w, b, 1e-6))
            return F.silu(F.normalize(x, dim=1) * C**0.5 * w)
        comp = torch.compile(eager)
        us = graph_us(comp)
        print(f"{name:20s} {'torch.compile':44} {us:8.1f} us "
              f"{100 * nbytes / (us * 1e-6) / 1e9 / ceil:6.1f}% of floor", flush=True)
    best = min(res)
    print(f"BEST {name}: {best[1]} {best[0]:.1f} us {best[2]:.1f}%", flush=True)
    torch.cuda.empty_cache()
