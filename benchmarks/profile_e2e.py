"""Where a patched step's GPU time goes: torch.profiler over one step of an e2e model
(default Wan-14B 480p, 2 blocks, bf16): unpatched eager, unpatched compile, patched eager
and (with a third argument "compile") patched + compile; "patched": patched eager and
patched + compile only; the top CUDA kernels by total time
and the kernels' sum (its gap to the e2e step time is host-side idle GPU). Informs what
issue 7 still has to fuse.

usage: python benchmarks/profile_e2e.py [MODEL] [LAYERS] [compile | patched]"""
import sys
from collections import defaultdict

import torch

import ditfuse
from ditfuse.e2e import E2E_MODELS, build_model

name = sys.argv[1] if len(sys.argv) > 1 else "wan14b-480p"
layers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
spec = E2E_MODELS[name]
model = build_model(spec, layers, "cuda", torch.bfloat16)
kw = spec.inputs("cuda", torch.bfloat16, cfg=model.config, **spec.sizes)


def profile(label, fn, top=32):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    agg = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            a = agg[e.name[:90]]
            a[0] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            a[1] += 1
    total = sum(v[0] for v in agg.values())
    print(f"== {label}: {total / 1e3:.2f} ms of kernels, {sum(v[1] for v in agg.values())} launches", flush=True)
    for k, (us, n) in sorted(agg.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {us / 1e3:8.3f} ms {n:4d}x  {k}")


mode = sys.argv[3] if len(sys.argv) > 3 else ""
with torch.no_grad():
    if mode != "patched":
        profile("unpatched eager", lambda: model(**kw))
        comp = torch.compile(model)
        profile("unpatched compile", lambda: comp(**kw))
        torch._dynamo.reset()
    ditfuse.patch(model)
    profile("patched eager", lambda: model(**kw))
    if mode in ("compile", "patched"):
        comp = torch.compile(model)
        profile("patched compile", lambda: comp(**kw))
