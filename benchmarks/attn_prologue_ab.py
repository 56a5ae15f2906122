"""SAME's own attention call (DyT q/k norm + rotate-half RoPE over 32 of 64 channels) on
the GPU, two ways (session 8):

  fused    one kernel, the prologue applied to the Q/K tiles as they load (a K tile is
           normalised and rotated once per query tile that visits it: ~2x at window 17)
  unfused  qk_norm_rope(q1, k1) and (q2, k2) into scratch, then the attention kernel
           without the prologue (more bytes: Q and K written and read again)

at the same attention launch settings, so the two give the same bits (checked). CUDA-graph
device time, L2 flushed; also the prologue-free attention alone on the same data, and the
public call as it routes (eager and replayed from a graph).

    python benchmarks/attn_prologue_ab.py [--cfg BM,BN,W,S,TM,CAP ...]
"""
import sys

import torch

import ditfuse
from ditfuse import attention as A
from ditfuse.bench import copy_ceiling_gbps, graph_us
from ditfuse.norms import NormSpec
from ditfuse.shapes import ATTN_SHAPES

CFGS = [(64, 16, 4, 3, True, 168), (64, 32, 4, 3, True, 168)]
for a in sys.argv[1:]:
    if a.startswith("--cfg="):
        CFGS = [tuple(int(x) if x not in ("True", "False") else x == "True"
                      for x in c.split(",")) for c in a[6:].split(";")]


def main():
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ceil = copy_ceiling_gbps() if dev == "cuda" else 4270.0
    print(f"copy ceiling {ceil:.0f} GB/s", flush=True)
    cases = (("same-l-8704", torch.bfloat16), ("same-l-8704", torch.float32),
             ("same-l-32946", torch.bfloat16))
    for name, dt in cases:
        sh = ATTN_SHAPES[name]
        B, N, H, D, w = sh.B, sh.N, sh.H, sh.D, sh.window
        if dev == "cpu":
            N = 100
        g = torch.Generator(device=dev).manual_seed(0)
        proj = torch.randn(B, N, 5 * H * D, generator=g, device=dev).to(dt)
        q1, q2, k1, k2, v = [t.unflatten(-1, (H, D)) for t in proj.chunk(5, dim=-1)]

        def dyt():
            return NormSpec("dyt", weight=torch.randn(D, generator=g, device=dev).to(dt) * 0.3 + 1,
                            bias=torch.randn(D, generator=g, device=dev).to(dt) * 0.1,
                            alpha=torch.full((1,), 0.7, dtype=dt, device=dev), eps=None)
        qn, kn = dyt(), dyt()
        R = 32
        inv = 1.0 / 10000.0 ** (torch.arange(0, R, 2, device=dev, dtype=torch.float32) / R)
        fr = torch.outer(torch.arange(N, device=dev, dtype=torch.float32), inv)
        fr = torch.cat((fr, fr), -1)
        cos, sin = fr.cos(), fr.sin()
        rope = dict(rope_style="half", rotary_dim=R)
        fused = A.plan(q1, k1, v, w, q2=q2, k2=k2, q_norm=qn, k_norm=kn, cos=cos, sin=sin,
                       **rope)
        scratch = [torch.empty(B, N, H, D, dtype=dt, device=dev) for _ in range(4)]
        plain = A.plan(scratch[0], scratch[1], v, w, q2=scratch[2], k2=scratch[3])
        nbytes = 6 * B * N * H * D * proj.element_size()
        table = A.launch_settings(D, dt, w, w, N, True, True)
        print(f"{name} {dt}: table with prologue {table}", flush=True)

        def pre():
            ditfuse.qk_norm_rope(q1, k1, cos, sin, q_norm=qn, k_norm=kn,
                                 out=(scratch[0], scratch[1]), **rope)
            ditfuse.qk_norm_rope(q2, k2, cos, sin, q_norm=qn, k_norm=kn,
                                 out=(scratch[2], scratch[3]), **rope)

        def call():
            return ditfuse.sliding_window_attention(q1, k1, v, w, q2=q2, k2=k2, q_norm=qn,
                                                    k_norm=kn, cos=cos, sin=sin, **rope)

        if dev == "cuda":
            from triton.testing import do_bench
            call()
            t_call = do_bench(call, warmup=25, rep=200, return_mode="median") * 1e3
            print(f"{name:13s} {str(dt)[6:]:8s} the public call (prologue apart: "
                  f"{A.prologue_apart(D, w, w, True, True)}): eager {t_call:7.1f} us, "
                  f"graph {graph_us(call):7.1f} us", flush=True)
        for cfg in CFGS:
            a = A.run(fused, cfg)
            pre()
            b = A.run(plain, cfg)
            same = torch.equal(a, b)
            d = (a.float() - b.float()).abs().max().item()
            if dev == "cpu":
                print(f"{name} {cfg}: same bits {same} max|d| {d:.3g}", flush=True)
                continue
            t_fused = graph_us(lambda cfg=cfg: A.run(fused, cfg))
            t_pre = graph_us(pre)
            t_attn = graph_us(lambda cfg=cfg: A.run(plain, cfg))
            t_unf = graph_us(lambda cfg=cfg: (pre(), A.run(plain, cfg)))
            pct = 100 * nbytes / (t_fused * 1e-6) / 1e9 / ceil
            print(f"{name:13s} {str(dt)[6:]:8s} {cfg}: fused {t_fused:7.1f} us ({pct:4.1f}% of "
                  f"floor) | unfused {t_unf:7.1f} = qk_norm_rope x2 {t_pre:6.1f} + attention "
                  f"{t_attn:6.1f} | same bits {same} (max|d| {d:.3g})", flush=True)


if __name__ == "__main__":
    main()
