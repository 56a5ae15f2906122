"""Where FLUX.1's compiled VAE decode loses with ditfuse's kernels in the graph (session 22).

Session 21 (logs/s21/i): decode at 1024^2 bf16 35.8 ms compiled unpatched, 46.8 ms compiled
with the fused norms in the graph (eager patched 38.7). Here: both again, a torch.profiler
table of each (CUDA time by kernel), and the layouts the fused op receives under compile.

    PYTHONPATH=src python benchmarks/vae_compile_profile.py [latent_hw]
"""
import collections
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import ditfuse
import ditfuse.group_norm as gn
import ditfuse.patching._vae as pv
from vae_e2e import flux, timed  # benchmarks/ is the script's directory

hw = int(sys.argv[1]) if len(sys.argv) > 1 else 128
torch.manual_seed(0)
vae = flux().to("cuda", torch.bfloat16).eval()
z = torch.randn(1, 16, hw, hw, device="cuda", dtype=torch.bfloat16)
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
            ms = timed(lambda: vae.decode(z))
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                vae.decode(z)
                torch.cuda.synchronize()
    finally:
        vae.decoder = dec
    print(f"== {tag}: {ms:.2f} ms", flush=True)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30, max_name_column_width=90))


run("compiled unpatched")
print(ditfuse.patch(vae))
pv.compiling = lambda: False  # the fused norms in the graph (session 21's 46.8 ms path)
gn._call = recording_call
torch._dynamo.reset()
run("compiled patched, kernels in the graph")
print("layouts the fused op received (rms, shape, strides): calls")
for k, v in sorted(seen.items(), key=lambda kv: -kv[1]):
    print(f"  {k}: {v}")
