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

from ditfuse.bench import graph_us
from tree_times import gn_call  # benchmarks/ is the script's directory

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
for name in names:  # the inputs and call of benchmarks/tree_times.py (same data)
    f = gn_call(name, torch.bfloat16, launch)
    print(f"{tag:6s} {name:20s} {graph_us(f):8.1f} us", flush=True)
