"""FlexAttention's own time at the SAME-L differential shapes, measured several ways, against
ditfuse's: the ">= 4x FlexAttention" target depends on it, and FlexAttention's time moves
between runs (one bench cell at SAME-L 8704 bf16 read 225.4 us, another 281.9;
docs/design/attention.md). Each round: FlexAttention (compiled, a sliding-window block mask,
both maps and the difference, as `ditfuse bench` calls it) by do_bench's median (eager
launches, L2 flushed) and by CUDA-graph replay (GPU time only); ditfuse's call likewise.

    PYTHONPATH=src python benchmarks/attention_vs_flex.py [--rounds 3] \
        [--cases same-l-8704-bfloat16,...]
"""

import sys

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import ditfuse
from ditfuse.tools.bench import _median_us as do_bench_us
from ditfuse.tools.bench import graph_us

CASES = [
    ("same-l-8704", 8704, torch.bfloat16),
    ("same-l-8704", 8704, torch.float16),
    ("same-l-32946", 32946, torch.bfloat16),
    ("same-l-trt", 4352, torch.bfloat16),
]


def main():
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 3
    fa = torch.compile(flex_attention)
    only = sys.argv[sys.argv.index("--cases") + 1].split(",") if "--cases" in sys.argv else None
    for name, N, dt in CASES:
        if only and f"{name}-{str(dt)[6:]}" not in only:
            continue
        g = torch.Generator(device="cuda").manual_seed(0)
        proj = torch.randn(1, N, 5 * 24 * 64, generator=g, device="cuda").to(dt)
        q1, q2, k1, k2, v = [t.unflatten(-1, (24, 64)) for t in proj.chunk(5, dim=-1)]
        bm = create_block_mask(
            lambda b, h, qi, ki: (qi - ki).abs() <= 17, None, None, N, N, device="cuda"
        )
        t1, t2, k1t, k2t, vt = [t.transpose(1, 2) for t in (q1, q2, k1, k2, v)]

        def flex():
            return fa(t1, k1t, vt, block_mask=bm) - fa(t2, k2t, vt, block_mask=bm)

        def ours():
            return ditfuse.sliding_window_attention(q1, k1, v, 17, q2=q2, k2=k2)

        ref = flex().float()
        err = (ours().float() - ref.transpose(1, 2)).abs().max().item()
        for r in range(rounds):
            fb, fg = do_bench_us(flex), graph_us(flex)
            ob, og = do_bench_us(ours), graph_us(ours)
            print(
                f"{name:13s} {str(dt)[6:]:8s} round {r}: flex {fb:7.1f} (graph {fg:7.1f}) us | "
                f"ditfuse {ob:6.1f} (graph {og:6.1f}) us | x {fb / ob:.2f} (graph {fg / og:.2f})"
                f" | max|ditfuse - flex| {err:.3g}",
                flush=True,
            )


if __name__ == "__main__":
    main()
