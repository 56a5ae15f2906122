"""Launch variants of the shipped channel-RMS kernel at wan-vae-out-480p (session 21).

rms_probe.py found the shipped tiles' access pattern alone (64 positions x 96 channel rows a
program, y = x) at 176 us and at 128 positions 159 us, against 148 for a contiguous copy and
196 for the kernel; Nsight Compute: 96 registers (5 programs an SM), 0.58 issues a cycle a
scheduler, the cross-warp sum's shared memory 6.7-way bank conflicted. Timed here (bf16,
CUDA graphs, L2 flushed before each replay): positions a program (BS), warps, and a register
cap (maxnreg: more programs an SM), each output compared with the shipped call's.

    PYTHONPATH=src python benchmarks/rms_variants.py
"""
import dataclasses

import torch

import ditfuse
from ditfuse import _fastpath
from ditfuse import group_norm as gn
from ditfuse.bench import graph_us
from ditfuse.shapes import GN_SHAPES

sh = GN_SHAPES["wan-vae-out-480p"]
N, C = sh.shape[:2]
S = 1
for d in sh.shape[2:]:
    S *= d
g = torch.Generator(device="cuda").manual_seed(0)
x = (torch.randn(sh.shape, generator=g, device="cuda") * 2 + 0.5).to(torch.bfloat16)
ps = (C,) + (1,) * (len(sh.shape) - 2)
w = (torch.randn(ps, generator=g, device="cuda") * 0.5 + 1).to(torch.bfloat16)
b = (torch.randn(ps, generator=g, device="cuda") * 0.2).to(torch.bfloat16)
ref = ditfuse.rms_norm_silu_channels(x, w, b)
p = gn.plan_rms_channels(x, gamma=w, bias=b)
base = gn.rms_settings(C, S)
print(f"shipped {base}: {graph_us(lambda: ditfuse.rms_norm_silu_channels(x, w, b)):8.1f} us",
      flush=True)
extra = {}
orig_launch = _fastpath.launch


def launch(kernel, grid, args, kwargs):
    orig_launch(kernel, grid, args, dict(kwargs, **extra))


gn._fastpath.launch = launch
out = torch.empty_like(x)
os_ = gn._ncs(out, "out")[3]
for BS, W in ((64, 4), (64, 2), (64, 8), (128, 4), (128, 8), (256, 8), (32, 4)):
    st = dataclasses.replace(base, BS=BS, num_warps=W)
    for cap in (None, 64, 72, 80, 128):
        extra.clear()
        if cap:
            extra["maxnreg"] = cap
        out.fill_(float("nan"))
        try:
            gn.launch_rms_channels(p, out, os_, settings=st)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 -- report and go on
            print(f"BS={BS:<3d} W={W} cap={cap}: {type(e).__name__}: {e}"[:200], flush=True)
            continue
        d = (out.float() - ref.float()).abs().max().item()
        same = torch.equal(out, ref)
        t = graph_us(lambda: gn.launch_rms_channels(p, out, os_, settings=st))
        print(f"BS={BS:<3d} W={W} cap={str(cap):4s} {t:8.1f} us  bitwise {same}  max|d| {d:.3g}",
              flush=True)
gn._fastpath.launch = orig_launch
print(f"shipped again: {graph_us(lambda: ditfuse.rms_norm_silu_channels(x, w, b)):8.1f} us")
