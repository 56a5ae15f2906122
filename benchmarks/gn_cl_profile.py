"""Where GroupNorm + SiLU's time goes, channels-first against channels-last (session 24):
per shape the CUDA-graph time of the call and each of its kernels' mean device time
(torch.profiler over calls with the L2 flushed between them), and the launch settings.

    PYTHONPATH=src python benchmarks/gn_cl_profile.py [shape ...]
"""
import collections
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import ditfuse
from ditfuse import group_norm as gn
from ditfuse.bench import graph_us
from ditfuse.shapes import GN_SHAPES


def make(name, cl, dt=torch.bfloat16, launch=None):
    sh = GN_SHAPES[name]
    C = sh.shape[1]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(sh.shape, generator=g, device="cuda") * 2 + 0.5).to(dt)
    if cl:
        x = x.to(memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d)
    w = (torch.randn(C, generator=g, device="cuda") * 0.5 + 1).to(dt)
    b = (torch.randn(C, generator=g, device="cuda") * 0.2).to(dt)
    return x, (lambda: ditfuse.group_norm_silu(x, sh.groups, w, b, 1e-6, _launch=launch)), sh


def kernels(f, reps=20):
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.zero_()
            f()
        torch.cuda.synchronize()
    tot = collections.defaultdict(float)
    cnt = collections.Counter()
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and "_gn" in ev.name:
            tot[ev.name] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
            cnt[ev.name] += 1
    return {k: tot[k] / cnt[k] for k in tot}


SWEEP = [{"stats_programs": 256}, {"stats_programs": 512}, {"stats_programs": 2048},
         {"cl_lanes": 32}, {"cl_lanes": 128}, {"tile": 4096}, {"tile": 16384},
         {"tile": 16384, "stats_programs": 512}]


SWEEP2 = [dict(stats_programs=sp, tile=t) for t in (4096, 8192) for sp in (128, 192, 256, 384)]


def sweep(names, variants=SWEEP):
    """The channels-last path's launch table against gn_settings overrides (time only)."""
    for name in names:
        base = graph_us(make(name, True)[1])
        cells = []
        for kw in variants:
            x, f, sh = make(name, True, launch=kw)
            cells.append(f"{','.join(f'{k}={v}' for k, v in kw.items())} {graph_us(f):6.1f}")
        print(f"{name:18s} cl table {base:6.1f} | " + " | ".join(cells), flush=True)


def cf(names):
    """The channels-first split path's statistics programs against the table (time only)."""
    for name in names:
        cells = [f"table {graph_us(make(name, False)[1]):6.1f}"]
        for kw in ({"stats_programs": 512}, {"stats_programs": 2048}, {"stats_programs": 4096},
                   {"stats_programs": 2048, "max_partials": 256}):
            cells.append(f"{kw} {graph_us(make(name, False, launch=kw)[1]):6.1f}")
        print(f"{name:18s} cf | " + " | ".join(cells), flush=True)


def tpp(names):
    """Statistics programs of any tile count (tpp_pow2=False) against power-of-two counts,
    channels-first and channels-last (time only)."""
    for name in names:
        cells = []
        for cl in (False, True):
            for kw in (None, {"tpp_pow2": False}):
                x, f, sh = make(name, cl, launch=kw)
                N, C = x.shape[:2]
                st = gn.gn_settings(N, sh.groups, C // sh.groups, x.numel() // (N * C),
                                    c_inner=cl, **(kw or {}))
                cells.append(f"{'cl' if cl else 'cf'} {'any' if kw else 'pow2'} TPP {st.TPP} P {st.P} "
                             f"{graph_us(f):6.1f}")
        print(f"{name:18s} | " + " | ".join(cells), flush=True)


def warps(names):
    """The channels-last statistics / apply warps against the table's (time only)."""
    import dataclasses

    from ditfuse import _fastpath

    _fastpath.ENABLED = False  # a replay would keep the first variant's recorded launch
    table = gn.gn_settings
    for name in names:
        cells = []
        for sw, aw in ((8, 4), (4, 4), (16, 4), (8, 8), (8, 2)):
            def forced(*a, **k):
                st = table(*a, **k)
                return dataclasses.replace(st, stats_warps=sw, num_warps=aw) if st.path == "split-cl" else st
            gn.gn_settings = forced
            try:
                cells.append(f"stats {sw} / apply {aw} warps {graph_us(make(name, True)[1]):6.1f}")
            finally:
                gn.gn_settings = table
        print(f"{name:18s} cl | " + " | ".join(cells), flush=True)


def main(names):
    for name in names:
        for cl in (False, True):
            x, f, sh = make(name, cl)
            us = graph_us(f)
            N, C = x.shape[:2]
            S = x.numel() // (N * C)
            st = gn.gn_settings(N, sh.groups, C // sh.groups, S, c_inner=cl)
            ks = kernels(f)
            parts = "  ".join(f"{k.replace('_kernel', '')} {v:6.1f}" for k, v in ks.items())
            print(f"{name:18s} {'cl' if cl else 'cf'} graph {us:6.1f} us | {parts} | {st}", flush=True)


if __name__ == "__main__":
    if "--cf" in sys.argv:
        cf([a for a in sys.argv[1:] if a != "--cf"] or [
            "hunyuan-vae-up-9f", "flux-vae-up1-256", "flux-vae-up2-512", "flux-vae-out-1024"])
        sys.exit(0)
    if "--tpp" in sys.argv:
        tpp([a for a in sys.argv[1:] if a != "--tpp"] or [
            "flux-vae-mid-128", "hunyuan-vae-mid", "hunyuan-vae-up-9f", "flux-vae-up1-256",
            "flux-vae-up2-512", "flux-vae-out-1024"])
        sys.exit(0)
    if "--warps" in sys.argv:
        warps([a for a in sys.argv[1:] if a != "--warps"] or [
            "flux-vae-mid-128", "hunyuan-vae-mid", "hunyuan-vae-up-9f", "flux-vae-up1-256",
            "flux-vae-up2-512", "flux-vae-out-1024"])
        sys.exit(0)
    if "--sweep2" in sys.argv:
        sweep([a for a in sys.argv[1:] if a != "--sweep2"] or [
            "flux-vae-mid-128", "hunyuan-vae-mid", "hunyuan-vae-up-9f", "flux-vae-up1-256",
            "flux-vae-up2-512", "flux-vae-out-1024"], SWEEP2)
        sys.exit(0)
    if "--sweep" in sys.argv:
        sweep([a for a in sys.argv[1:] if a != "--sweep"] or ["flux-vae-mid-128", "hunyuan-vae-up-9f",
                                                             "flux-vae-up1-256", "flux-vae-up2-512"])
        sys.exit(0)
    main(sys.argv[1:] or ["flux-vae-mid-128", "hunyuan-vae-mid", "hunyuan-vae-up-9f",
                          "flux-vae-up1-256", "flux-vae-up2-512", "flux-vae-out-1024"])
