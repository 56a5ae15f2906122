"""Session 27 A/B: the public call ``ditfuse.sliding_window_attention`` with the sm_90 Gluon
route on and off (``attention.GLUON_SM90``), alternating rounds, CUDA-graph replay (min of
``graph_us``), at the SAME-L 16-bit differential shapes; the outputs of the two routes
compared bit for bit.

    PYTHONPATH=src python benchmarks/attn_gluon_ab.py [--rounds 5]
"""
import sys

import torch

import ditfuse
from ditfuse import attention
from ditfuse.bench import graph_us

CASES = [("same-l-8704", 8704, torch.bfloat16), ("same-l-32946", 32946, torch.bfloat16),
         ("same-l-trt-shape", 4352, torch.bfloat16), ("same-l-8704-fp16", 8704, torch.float16)]


def main():
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 5
    for name, N, dt in CASES:
        g = torch.Generator(device="cuda").manual_seed(0)
        proj = torch.randn(1, N, 5 * 24 * 64, generator=g, device="cuda").to(dt)
        q1, q2, k1, k2, v = [t.unflatten(-1, (24, 64)) for t in proj.chunk(5, dim=-1)]
        call = lambda: ditfuse.sliding_window_attention(q1, k1, v, 17, q2=q2, k2=k2)
        outs, times = {}, {True: [], False: []}
        for r in range(rounds):
            for on in (True, False):
                attention.GLUON_SM90 = on
                if r == 0:
                    outs[on] = call()
                times[on].append(graph_us(call))
        attention.GLUON_SM90 = True
        same = torch.equal(outs[True].view(torch.int16), outs[False].view(torch.int16))
        fmt = lambda ts: " ".join(f"{t:6.1f}" for t in ts)
        print(f"{name:18s} {str(dt)[6:]:8s} gluon {fmt(times[True])} | triton {fmt(times[False])}"
              f" | min {min(times[True]):6.1f} vs {min(times[False]):6.1f} us"
              f" ({min(times[False]) / min(times[True]):.3f}x), bitwise {same}", flush=True)


if __name__ == "__main__":
    main()
