"""What a head dim that is not a power of two costs: sliding_window_attention at SAME-L's
N = 8704, 24 heads, window 17, bf16, differential (no prologue), head_dim 64 / 80 / 96 / 128
(80 and 96 run on 128-wide tiles), CUDA-graph replay time (do_bench_cudagraph) and the
byte floor of each (q1, q2, k1, k2, v read once, out written once) at the copy ceiling.

usage: python benchmarks/attn_padded_times.py"""
import torch
import triton

import ditfuse

N, H, W = 8704, 24, 17
dt = torch.bfloat16
dev = "cuda"
src = torch.empty(2**28, dtype=torch.uint8, device=dev)
dst = torch.empty_like(src)
ceiling = 2 * src.numel() / (triton.testing.do_bench_cudagraph(lambda: dst.copy_(src)) * 1e-3)
print(f"copy ceiling {ceiling / 1e9:.0f} GB/s")
for D in (64, 80, 96, 128):
    g = torch.Generator(device=dev).manual_seed(D)
    proj = torch.randn(1, N, 5 * H * D, generator=g, device=dev).to(dt)
    q1, q2, k1, k2, v = (t.unflatten(-1, (H, D)) for t in proj.chunk(5, -1))
    fn = lambda: ditfuse.sliding_window_attention(q1, k1, v, W, q2=q2, k2=k2)  # noqa: E731
    out = fn()
    ref = ditfuse.reference.sliding_window_attention_reference(
        q1[:, :512], k1[:, :512], v[:, :512], W, q2=q2[:, :512], k2=k2[:, :512],
        compute_dtype=torch.float64)
    err = ((out[:, :480].double() - ref[:, :480]).abs().max() / ref[:, :480].abs().max()).item()
    us = triton.testing.do_bench_cudagraph(fn) * 1e3
    floor = 6 * N * H * D * 2 / ceiling * 1e6
    print(f"D={D:4d} {us:8.1f} us  floor {floor:6.1f} us  {100 * floor / us:5.1f}% of floor  "
          f"max err / max|ref| (first 480 rows) {err:.2e}", flush=True)
