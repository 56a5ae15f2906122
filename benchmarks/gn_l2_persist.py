"""GroupNorm's split path with an L2 set-aside for persisting lines (session 24 experiment).

The statistics pass loads x with ``evict_last`` so that the apply pass finds what it can of
x in L2 (session 11). On Ampere and later an ``evict_last`` line is a *persisting* line,
and persisting lines live in the L2 set-aside, whose size (``CU_LIMIT_PERSISTING_L2_CACHE_SIZE``)
is 0 unless a program sets it. This times the split path with the set-aside at 0 (the
default: every run so far) and at sizes up to the device's maximum, each replay starting
from a clean L2: persisting lines reset to normal (``cuCtxResetPersistingL2Cache``), then
the usual flush buffer written.

    PYTHONPATH=src python benchmarks/gn_l2_persist.py [shape ...]
"""
import ctypes
import statistics
import sys

import torch

import ditfuse
from ditfuse.shapes import GN_SHAPES

CU_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06
CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE = 108
CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38

cuda = ctypes.CDLL("libcuda.so.1")


def _check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: CUresult {rc}")


def attr(a):
    v = ctypes.c_int()
    _check(cuda.cuDeviceGetAttribute(ctypes.byref(v), a, torch.cuda.current_device()), "attr")
    return v.value


def set_persisting(nbytes):
    _check(cuda.cuCtxSetLimit(CU_LIMIT_PERSISTING_L2_CACHE_SIZE, ctypes.c_size_t(nbytes)),
           "cuCtxSetLimit")
    v = ctypes.c_size_t()
    _check(cuda.cuCtxGetLimit(ctypes.byref(v), CU_LIMIT_PERSISTING_L2_CACHE_SIZE), "get")
    return v.value


def reset_persisting():
    _check(cuda.cuCtxResetPersistingL2Cache(), "cuCtxResetPersistingL2Cache")


def replay_us(g, flush, reps=60):
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        reset_persisting()
        flush.zero_()
        s = torch.cuda.Event(enable_timing=True)
        e = torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e3)
    return statistics.median(ts[5:])


def gn_call(name, dt):
    """The bench's GroupNorm + SiLU call at a registry shape (channels-last where it says)."""
    sh = GN_SHAPES[name]
    C = sh.shape[1]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(sh.shape, generator=g, device="cuda") * 2 + 0.5).to(dt)
    if getattr(sh, "channels_last", False):
        x = x.to(memory_format=torch.channels_last)
    w = (torch.randn(C, generator=g, device="cuda") * 0.5 + 1).to(dt)
    b = (torch.randn(C, generator=g, device="cuda") * 0.2).to(dt)
    return lambda: ditfuse.group_norm_silu(x, sh.groups, w, b, 1e-6)


def main(names):
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    l2 = attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
    pmax = attr(CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE)
    print(f"L2 {l2 / 2**20:.1f} MiB, max persisting set-aside {pmax / 2**20:.1f} MiB", flush=True)
    flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")
    sizes = [0, pmax // 2, pmax]
    for name in names:
        f = gn_call(name, torch.bfloat16)
        outs = {}
        graphs = {}
        for sz in sizes:
            set_persisting(sz)
            y = f()
            torch.cuda.synchronize()
            outs[sz] = y.clone()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                f()
            graphs[sz] = g
        same = all(torch.equal(outs[0], outs[s]) for s in sizes)
        row = {s: [] for s in sizes}
        for _ in range(2):  # alternating
            for sz in sizes:
                set_persisting(sz)
                row[sz].append(replay_us(graphs[sz], flush))
        cells = "  ".join(f"{s / 2**20:5.1f} MiB {min(v):7.1f} ({max(v):.1f})" for s, v in row.items())
        print(f"{name:22s} bits equal {same}  {cells}", flush=True)
        set_persisting(0)


if __name__ == "__main__":
    main(sys.argv[1:] or ["flux-vae-mid-128", "hunyuan-vae-mid", "hunyuan-vae-up-9f",
                          "flux-vae-up1-256", "flux-vae-up2-512", "flux-vae-out-1024",
                          "flux-vae-mid-128-cl", "flux-vae-up1-256-cl", "flux-vae-up2-512-cl"])
