"""CUDA-graph time (us) of GroupNorm + SiLU / channel RMS + SiLU at a few registry shapes.

Run with PYTHONPATH pointing at the ditfuse tree to time (an A/B of two trees: run it once
per tree, alternating); prints one line per shape: tag, shape, microseconds. Launch-table
overrides from the environment: LAUNCH='{"tile": 4096}' (keyword arguments of gn_settings /
rms_settings, passed as ``_launch``), WARPS=n (num_warps of the RMS / GroupNorm apply
launches), STATS_WARPS=n (the GroupNorm statistics pass's).
"""
import dataclasses
import json
import os
import sys

import torch

import ditfuse
from ditfuse.bench import graph_us
from ditfuse.shapes import GN_SHAPES

from ditfuse import group_norm as gn  # noqa: E402

launch = json.loads(os.environ.get("LAUNCH", "null"))
force = {k: int(os.environ[e]) for k, e in (("num_warps", "WARPS"), ("stats_warps", "STATS_WARPS"))
         if os.environ.get(e)}
if force:
    for fname in ("gn_settings", "rms_settings"):
        def forced(*a, _f=getattr(gn, fname), **k):
            st = _f(*a, **k)
            return dataclasses.replace(st, **{f: v for f, v in force.items() if hasattr(st, f)})
        setattr(gn, fname, forced)
tag = sys.argv[1] if len(sys.argv) > 1 else "tree"
names = sys.argv[2:] or ["flux-vae-out-1024", "flux-vae-up1-256", "hunyuan-vae-up-9f",
                         "wan-vae-out-480p", "wan-vae-mid-480p", "flux-vae-mid-128"]
for name in names:
    sh = GN_SHAPES[name]
    C = sh.shape[1]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(sh.shape, generator=g, device="cuda") * 2 + 0.5).to(torch.bfloat16)
    ps = (C,) + (1,) * (len(sh.shape) - 2) if sh.op == "rms" else (C,)
    w = (torch.randn(ps, generator=g, device="cuda") * 0.5 + 1).to(torch.bfloat16)
    b = (torch.randn(ps, generator=g, device="cuda") * 0.2).to(torch.bfloat16)
    if sh.op == "rms":
        def f():
            return ditfuse.rms_norm_silu_channels(x, w, b, _launch=launch)
    else:
        def f():
            return ditfuse.group_norm_silu(x, sh.groups, w, b, 1e-6, _launch=launch)
    print(f"{tag:6s} {name:20s} {graph_us(f):8.1f} us", flush=True)
