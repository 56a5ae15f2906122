"""Patched + compiled FLUX.1 slower than patched eager (session 5, after replayed
launches): is it the host? Step time (synced) and host time (5 steps launched, then a
sync) of the compiled model unpatched, patched, and patched with the pure elementwise
gated residuals (and then also the norm + modulate) left to inductor under compile.

usage: python benchmarks/diag_compile_variants.py [MODEL] [LAYERS]"""
import sys
import time

import torch

import ditfuse
import ditfuse.adaln as adaln_mod
import ditfuse.patching._flux as flux_patch
from ditfuse.e2e import E2E_MODELS, build_model

name = sys.argv[1] if len(sys.argv) > 1 else "flux1-1024"
layers = int(sys.argv[2]) if len(sys.argv) > 2 else 4
spec = E2E_MODELS[name]
model = build_model(spec, layers, "cuda", torch.bfloat16)
kw = spec.inputs("cuda", torch.bfloat16, cfg=model.config, **spec.sizes)

real_gr, real_mod = adaln_mod.gated_residual, adaln_mod.adaln_modulate


def eager_gr(x, y, gate=None, *, rounding="once", out=None):
    if torch.compiler.is_compiling() and out is None and rounding == "per_op":
        return x + (gate.unsqueeze(1) if gate.dim() == 2 else gate) * y
    return real_gr(x, y, gate, rounding=rounding, out=out)


def eager_mod(x, shift=None, scale=None, *, norm="layer", eps=1e-6, rounding="once", **k):
    if torch.compiler.is_compiling() and norm == "layer" and not k and rounding == "per_op":
        n = torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=eps)
        return n * (1 + scale[:, None]) + shift[:, None]
    return real_mod(x, shift, scale, norm=norm, eps=eps, rounding=rounding, **k)


def measure(label, fn, n=5):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e3
    torch.cuda.synchronize()
    step = (time.perf_counter() - t) / n * 1e3
    print(f"{name} {layers}: {label:44s} {step:7.2f} ms a step, host {host:7.2f} ms", flush=True)


def compiled(label):
    torch._dynamo.reset()
    comp = torch.compile(model)
    measure(label, lambda: comp(**kw))


with torch.no_grad():
    measure("unpatched eager", lambda: model(**kw))
    compiled("unpatched compile")
    ditfuse.patch(model)
    measure("patched eager", lambda: model(**kw))
    compiled("patched compile")
    adaln_mod.gated_residual = flux_patch.gated_residual = eager_gr
    compiled("patched compile, gated residuals to inductor")
    adaln_mod.adaln_modulate = flux_patch.adaln_modulate = eager_mod
    compiled("patched compile, + modulate to inductor")
