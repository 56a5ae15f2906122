"""SAME's own attention call (differential, DyT + rotate-half RoPE over 32 of 64 channels, the
chunks of the packed to_qkv output, the prologue apart): the prologue as one qk_norm_rope pass
over Q1 / Q2 and K1 / K2 together (``attention.JOINT_PROLOGUE``) against two passes, CUDA-graph
time alternating ROUNDS times, and the outputs compared.

    PYTHONPATH=src python benchmarks/attn_joint_ab.py [--rounds=2]
"""
import sys

import torch

import ditfuse
from ditfuse import _fastpath
from ditfuse import attention as A
from ditfuse.bench import graph_us
from ditfuse.norms import NormSpec


def main():
    rounds = int(next((a.split("=")[1] for a in sys.argv[1:] if a.startswith("--rounds=")), "2"))
    _fastpath.ENABLED = False  # the flag changes the launches at run time
    for N, dt in ((8704, torch.bfloat16), (32946, torch.bfloat16), (8704, torch.float32)):
        H, D, R = 24, 64, 32
        g = torch.Generator(device="cuda").manual_seed(0)
        proj = torch.randn(1, N, 5 * H * D, generator=g, device="cuda").to(dt)
        q1, q2, k1, k2, v = (t.unflatten(-1, (H, D)) for t in proj.chunk(5, -1))

        def dyt():
            return NormSpec("dyt", weight=(torch.randn(D, generator=g, device="cuda") * 0.3 + 1).to(dt),
                            bias=(torch.randn(D, generator=g, device="cuda") * 0.1).to(dt),
                            alpha=torch.full((1,), 0.7, dtype=dt, device="cuda"), eps=None)
        inv = 1.0 / 10000.0 ** (torch.arange(0, R, 2, device="cuda", dtype=torch.float32) / R)
        fr = torch.outer(torch.arange(N, device="cuda", dtype=torch.float32), inv)
        fr = torch.cat((fr, fr), -1)
        kw = dict(q2=q2, k2=k2, lam=0.8, q_norm=dyt(), k_norm=dyt(), cos=fr.cos(), sin=fr.sin(),
                  rotary_dim=R)

        def call():
            return ditfuse.sliding_window_attention(q1, k1, v, 17, **kw)

        outs, times = {}, {True: [], False: []}
        for _ in range(rounds):
            for joint in (False, True):
                A.JOINT_PROLOGUE = joint
                outs[joint] = call()
                times[joint].append(graph_us(call))
        d = (outs[True].float() - outs[False].float()).abs().max().item()
        print(f"N={N:6d} {str(dt)[6:]:9s} two passes {' / '.join(f'{t:.1f}' for t in times[False])} us"
              f"   one pass {' / '.join(f'{t:.1f}' for t in times[True])} us   max|d| {d:.3g}"
              f"   equal {torch.equal(outs[True], outs[False])}", flush=True)
    A.JOINT_PROLOGUE = True


if __name__ == "__main__":
    main()
