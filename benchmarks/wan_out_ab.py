"""Wan's qk_norm_rope in place (as the patched processor called it through session 16) against
out of place (fresh Q / K buffers, as diffusers' own processor produces new tensors), at the
registry's Wan shapes: CUDA-graph time (L2 flushed before every replay), alternating the two
forms ROUNDS times, and the bits of the two results compared on the same inputs.

    PYTHONPATH=src python benchmarks/wan_out_ab.py [--dtypes=bf16,fp16,fp32] [--rounds=2]
        [--shapes=wan14b-480p,...]

A shape may carry field overrides: ``flux2-1024+packed=9`` is FLUX.2's single-stream call (Q
and K chunks of the fused QKV + MLP projection, 9 x H*D wide).

Session 14's pattern study (logs/s14/e, the kernel of then) measured 388.4 us in place and
372.2 us out of place at 480p with separate Q / K tensors.
"""
import dataclasses
import sys

import torch

import ditfuse
from ditfuse.bench import copy_ceiling_gbps, graph_us
from ditfuse.shapes import QK_SHAPES
from ditfuse.workloads import qk_bytes, qk_inputs

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SHAPES = ["wan14b-480p", "wan14b-720p", "wan1.3b-480p", "wan5b-ti2v-704p", "wan14b-480p-fused",
          "wan14b-720p-fused"]


def arg(name, default):
    for a in sys.argv[1:]:
        if a.startswith(f"--{name}="):
            return a.split("=", 1)[1]
    return default


def main():
    dtypes = arg("dtypes", "bf16").split(",")
    rounds = int(arg("rounds", "2"))
    shapes = arg("shapes", ",".join(SHAPES)).split(",")
    ceil = copy_ceiling_gbps()
    print(f"copy ceiling {ceil:.0f} GB/s", flush=True)
    for dn in dtypes:
        dt = DT[dn]
        for name in shapes:
            base, *over = name.split("+")
            sh = dataclasses.replace(QK_SHAPES[base], **{f.split("=")[0]: int(f.split("=")[1])
                                                         for f in over})
            inp = qk_inputs(sh, "cuda", dt)
            kw = dict(inp["kwargs"], q_norm=inp["q_norm"], k_norm=inp["k_norm"])
            q, k, c, s = inp["q"], inp["k"], inp["call_cos"], inp["call_sin"]
            q0, k0 = q.clone(), k.clone()
            qo, ko = ditfuse.qk_norm_rope(q, k, c, s, inplace=False, **kw)
            ditfuse.qk_norm_rope(q, k, c, s, inplace=True, **kw)
            same = torch.equal(qo.view(-1), q.reshape(-1)) and torch.equal(ko.reshape(-1), k.reshape(-1))
            q.copy_(q0)
            k.copy_(k0)
            del q0, k0, qo, ko
            nbytes = qk_bytes(sh, dt)
            times = {"inplace": [], "out": []}
            for _ in range(rounds):
                for form in ("inplace", "out"):
                    ip = form == "inplace"
                    times[form].append(graph_us(
                        lambda ip=ip: ditfuse.qk_norm_rope(q, k, c, s, inplace=ip, **kw)))
            line = []
            for form, ts in times.items():
                best = min(ts)
                pct = f" {nbytes / (best * 1e-6) / 1e9 / ceil * 100:5.1f}%"
                line.append(f"{form} {' / '.join(f'{t:.1f}' for t in ts)} us{pct}")
            print(f"{name:18s} {dn:5s} " + "   ".join(line) + f"   same bits {same}", flush=True)
            inp = q = k = None  # free before the next shape


if __name__ == "__main__":
    main()
