"""Where FLUX.1's compiled VAE decode loses with ditfuse's kernels in the graph (session 22).

Session 21 (logs/s21/i): decode at 1024^2 bf16 35.8 ms compiled unpatched, 46.8 ms compiled
with the fused norms in the graph (eager patched 38.7). Here: both again, a torch.profiler
table of each (CUDA time by kernel), and the layouts the fused op receives under compile.

    PYTHONPATH=src python benchmarks/vae_compile_profile.py [case] [--tables]

case: a vae_e2e.py case (default flux-1024); --tables: the profiler tables too.
"""
import collections
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import ditfuse
import ditfuse.group_norm as gn
import ditfuse.patching._vae as pv
from vae_e2e import CASES, timed  # benchmarks/ is the script's directory

args = [a for a in sys.argv[1:] if not a.startswith("--")]
case = args[0] if args else "flux-1024"
build, zshape, dtypes = CASES[case]
torch.manual_seed(0)
vae = build().to("cuda", dtypes[0]).eval()
if hasattr(vae, "disable_tiling"):
    vae.disable_tiling()
z = torch.randn(zshape, device="cuda", dtype=dtypes[0])
seen = collections.Counter()
orig_call = gn._call


def recording_call(rms, x, *a, **k):
    seen[(rms, tuple(x.shape), tuple(x.stride()))] += 1
    return orig_call(rms, x, *a, **k)


def run(tag):
    dec = vae.decoder
    vae.decoder = torch.compile(dec)
    try:
        with torch.no_grad():
            out = vae.decode(z).sample
            ms = timed(lambda: vae.decode(z))
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                vae.decode(z)
                torch.cuda.synchronize()
    finally:
        vae.decoder = dec
    print(f"== {case} {tag}: {ms:.2f} ms", flush=True)
    if "--tables" in sys.argv:
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30,
                                        max_name_column_width=90))
    return out


ref = run("compiled unpatched")
print(ditfuse.patch(vae))
pv.compiling = lambda: False  # the fused norms in the graph (session 21's 46.8 ms path)
gn._call = recording_call
torch._dynamo.reset()
got = run("compiled patched, kernels in the graph")
print(f"max|d| vs compiled unpatched {(got.float() - ref.float()).abs().max().item():.3g} "
      f"of {ref.float().abs().max().item():.3g}")
print("layouts the fused op received (rms, shape, strides): calls")
for k, v in sorted(seen.items(), key=lambda kv: -kv[1]):
    print(f"  {k}: {v}")
