"""Patched eager step of an e2e model: step time (synced) against host time (launch the
steps, then sync), with the activation launch table of session 4 and the one before it.
usage: python benchmarks/diag_eager.py [MODEL] [LAYERS]"""
import sys
import time

import torch

import ditfuse
from ditfuse import activations
from ditfuse.e2e import E2E_MODELS, build_model

name = sys.argv[1] if len(sys.argv) > 1 else "flux1-1024"
layers = int(sys.argv[2]) if len(sys.argv) > 2 else 4
spec = E2E_MODELS[name]
model = build_model(spec, layers, "cuda", torch.bfloat16)
kw = spec.inputs("cuda", torch.bfloat16, cfg=model.config, **spec.sizes)
ditfuse.patch(model)
table = activations.launch_settings
with torch.no_grad():
    for label, ls in (("table (1, 2048, 4)", table), ("old (2, 2048, 8)", lambda N: (2, 2048, 8)),
                      ("table again", table)):
        activations.launch_settings = ls
        for _ in range(2):
            model(**kw)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(5):
            model(**kw)
        host = (time.perf_counter() - t) / 5 * 1e3
        torch.cuda.synchronize()
        step = (time.perf_counter() - t) / 5 * 1e3
        print(f"{name} {layers} patched eager, {label}: {step:.2f} ms a step, host {host:.2f} ms",
              flush=True)
