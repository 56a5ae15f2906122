"""Band attention's time against its program count (session 24 diagnostic): SAME-L's
differential call (24 heads x 64, window 17, packed projection views) at token counts around
the TensorRT contract shape (fp32) and SAME-L 8704 (bf16), with the table's launch. Prints N,
programs, programs / resident slots ("rounds") and the CUDA-graph time, to show whether the
time follows the rounds (a last, partly filled round costing a whole one) or the programs.

    PYTHONPATH=src python benchmarks/attn_waves.py
"""
import torch

import ditfuse
from ditfuse.bench import graph_us

SLOTS = {torch.float32: 132 * 5, torch.bfloat16: 132 * 3}  # resident programs (ncu / builds)


def call(N, dt, H=24, D=64):
    g = torch.Generator(device="cuda").manual_seed(0)
    proj = torch.randn(1, N, 5 * H * D, generator=g, device="cuda").to(dt)
    p = [t.unflatten(-1, (H, D)) for t in proj.chunk(5, dim=-1)]
    return lambda: ditfuse.sliding_window_attention(p[0], p[2], p[4], 17, q2=p[1], k2=p[3])


def main():
    for dt, Ns in ((torch.float32, range(3780, 4741, 60)), (torch.bfloat16, range(7800, 9301, 100))):
        for N in Ns:
            f = call(N, dt)
            us = graph_us(f)
            step = 30 if dt == torch.float32 else 62
            progs = 24 * -(-N // step)
            print(f"{str(dt):15s} N {N:5d} programs {progs:5d} rounds {progs / SLOTS[dt]:5.2f} "
                  f"{us:7.1f} us  {us / -(-progs // SLOTS[dt]):5.2f} us/round "
                  f"{us * SLOTS[dt] / progs:5.2f} us/full-round-equiv", flush=True)


if __name__ == "__main__":
    main()
