"""The GPU's clock and power while a model step runs each of the four ways (a power-limited
GPU sets its SM clock by the load, so a short timing of one way can run at the clock the previous
way left; docs/design/end_to_end.md). One process, an e2e model (random weights),
the four ways of ``ditfuse bench --e2e`` in interleaved rounds; each way runs its steps
back to back for SECONDS while ``nvidia-smi`` samples the SM clock, power and temperature
every 20 ms: per way the step time, mean SM clock, mean power.

usage: python benchmarks/e2e_clocks.py [MODEL] [LAYERS] [SECONDS] [ROUNDS]"""

import copy
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import ditfuse
from ditfuse.tools.e2e import E2E_MODELS, build_model

name = sys.argv[1] if len(sys.argv) > 1 else "flux2-1024"
layers = int(sys.argv[2]) if len(sys.argv) > 2 else 4
seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 3.0
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 2
spec = E2E_MODELS[name]
model = build_model(spec, layers, "cuda", torch.bfloat16)
kw = spec.inputs("cuda", torch.bfloat16, cfg=model.config, **spec.sizes)

log = tempfile.NamedTemporaryFile("w+", suffix=".csv", delete=False)
smi = subprocess.Popen(
    [
        "nvidia-smi",
        "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
        "--format=csv,noheader,nounits",
        "-lms",
        "20",
        "-i",
        os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0],
    ],
    stdout=log,
    stderr=subprocess.DEVNULL,
)

with torch.no_grad():
    patched = copy.deepcopy(model)
    ditfuse.patch(patched)
    cu, cp = torch.compile(model), torch.compile(patched)
    fns = {
        "unpatched eager": lambda: model(**kw),
        "unpatched compile": lambda: cu(**kw),
        "patched eager": lambda: patched(**kw),
        "patched compile": lambda: cp(**kw),
    }
    for fn in fns.values():
        fn()
        fn()
    torch.cuda.synchronize()
    spans = []  # (impl, t0, t1, steps)
    for r in range(rounds):
        for impl, fn in fns.items():
            time.sleep(0.5)  # the same idle before every way
            t0 = time.time()
            n = 0
            while time.time() - t0 < seconds:
                fn()
                n += 1
                if n % 4 == 0:
                    torch.cuda.synchronize()
            torch.cuda.synchronize()
            spans.append((impl, t0, time.time(), n))
time.sleep(0.2)
smi.terminate()
smi.wait()
log.seek(0)
samples = []
for line in log:
    parts = [p.strip() for p in line.split(",")]
    try:
        ts = time.mktime(time.strptime(parts[0].split(".")[0], "%Y/%m/%d %H:%M:%S")) + float(
            "0." + parts[0].split(".")[1]
        )
        samples.append((ts, float(parts[1]), float(parts[2]), float(parts[3])))
    except (ValueError, IndexError):
        continue
print(f"{name}, {layers} blocks, {seconds:.0f} s a way, {rounds} rounds, {len(samples)} samples")
print(f"{'way':18s} {'ms/step':>8s} {'SM MHz':>7s} {'min':>5s} {'W':>6s} {'max W':>6s} {'C':>4s}")
for impl, t0, t1, n in spans:
    s = [x for x in samples if t0 + 0.3 <= x[0] <= t1]  # skip the ramp
    mhz = statistics.mean(x[1] for x in s) if s else float("nan")
    lo = min((x[1] for x in s), default=float("nan"))
    w = statistics.mean(x[2] for x in s) if s else float("nan")
    wmax = max((x[2] for x in s), default=float("nan"))
    c = statistics.mean(x[3] for x in s) if s else float("nan")
    print(
        f"{impl:18s} {(t1 - t0) / n * 1e3:8.2f} {mhz:7.0f} {lo:5.0f} {w:6.0f} {wmax:6.0f} {c:4.0f}",
        flush=True,
    )
