"""Why is a patched model slower compiled than eager (FLUX.1 at 4 + 8 blocks, session 4)?
One fresh process: the patched model only, compiled with inductor (the e2e's settings);
graph breaks, recompiles, frames, step time against patched eager, and where the host time
of one compiled step goes (torch.profiler, CPU and CUDA).

usage: python benchmarks/diag_compile.py [MODEL] [LAYERS]"""
import sys
import time

import torch

import ditfuse
from ditfuse.e2e import E2E_MODELS, build_model

name = sys.argv[1] if len(sys.argv) > 1 else "flux1-1024"
layers = int(sys.argv[2]) if len(sys.argv) > 2 else 4
spec = E2E_MODELS[name]
model = build_model(spec, layers, "cuda", torch.bfloat16)
kw = spec.inputs("cuda", torch.bfloat16, cfg=model.config, **spec.sizes)
ditfuse.patch(model)


def step_ms(fn, n=5):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3


with torch.no_grad():
    print(f"patched eager: {step_ms(lambda: model(**kw)):.2f} ms/step", flush=True)
    comp = torch.compile(model)
    comp(**kw)
    from torch._dynamo.utils import counters
    print("dynamo counters:", {k: dict(v) for k, v in counters.items() if k in ("stats", "graph_break", "recompiles")}, flush=True)
    print(f"patched compile: {step_ms(lambda: comp(**kw)):.2f} ms/step", flush=True)
    # host time without waiting for the GPU: launch n steps, then sync
    t = time.perf_counter()
    for _ in range(3):
        comp(**kw)
    host = (time.perf_counter() - t) / 3 * 1e3
    torch.cuda.synchronize()
    print(f"patched compile host time (no sync): {host:.2f} ms/step", flush=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        comp(**kw)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70))
