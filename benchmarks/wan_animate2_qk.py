"""Wan-Animate-2's self-attention QK-norm + RoPE on a GPU: the processor's eager code
(``norm_q`` / ``norm_k``: torch RMSNorm across heads, then ``rope_apply``: complex fp64
multipliers per grid cell, cast to fp32 and back) against the patched processor's call
(``qk_norm_rope`` on the half-width fp32 tables of :func:`ditfuse.patching.wan_animate2._tables`,
built once a step) at the 14B model's denoising pass (dim 5120, 40 heads of 128, 480x832:
21 latent frames of 30 x 52 patch cells) and its reference pass's K rotation. CUDA-graph
time (L2 flushed before every replay) and every output element compared with the eager one.

    PYTHONPATH=src python benchmarks/wan_animate2_qk.py [--frames=21] [--h=30] [--w=52]
"""

import math
import sys

import torch

from ditfuse import qk_norm_rope
from ditfuse.patching import wan_animate2 as wa2
from ditfuse.tools.bench import copy_ceiling_gbps, graph_us


def arg(name, default):
    for a in sys.argv[1:]:
        if a.startswith(f"--{name}="):
            return type(default)(a.split("=", 1)[1])
    return default


def main():
    from diffusers.models.transformers import transformer_wan_animate_2 as ta

    H, D = 40, 128
    dim = H * D
    grid = (arg("frames", 21), arg("h", 30), arg("w", 52))
    S = math.prod(grid)
    dev, dt = ("cuda" if torch.cuda.is_available() else "cpu"), torch.bfloat16
    torch.manual_seed(0)
    freqs = torch.cat(
        [
            ta.rope_params(512, D - 4 * (D // 6)),
            ta.rope_params(512, 2 * (D // 6)),
            ta.rope_params(512, 2 * (D // 6)),
        ],
        dim=1,
    ).to(dev)
    grid_sizes = torch.tensor([grid])
    norms = []
    for _ in range(2):
        n = torch.nn.RMSNorm(dim, eps=1e-6).to(dev, dt)
        with torch.no_grad():
            n.weight.copy_(1 + 0.1 * torch.randn(dim, device=dev))
        norms.append(n)
    q = torch.randn(1, S, dim, device=dev, dtype=dt)
    k = torch.randn(1, S, dim, device=dev, dtype=dt)
    ceiling = copy_ceiling_gbps() if dev == "cuda" else float("nan")
    floor_bytes = 4 * S * dim * 2 + 2 * S * (D // 2) * 4  # Q, K read + written; cos / sin once
    floor_us = floor_bytes / (ceiling * 1e9) * 1e6
    print(
        f"grid {grid}: S {S}, {H} x {D}, bf16; copy ceiling {ceiling:.0f} GB/s; "
        f"floor {floor_us:.1f} us"
    )

    @torch.no_grad()
    def eager():
        qn = norms[0](q).unflatten(2, (H, -1))
        kn = norms[1](k).unflatten(2, (H, -1))
        return (
            ta.rope_apply(qn, grid_sizes, freqs).type_as(qn),
            ta.rope_apply(kn, grid_sizes, freqs).type_as(kn),
        )

    cos, sin = wa2._tables(freqs, [grid], 1, S)

    @torch.no_grad()
    def fused():
        return qk_norm_rope(
            q, k, cos, sin, q_norm=norms[0], k_norm=norms[1], num_heads=H, rotary_dim=D
        )

    @torch.no_grad()
    def tables():
        return wa2._tables(freqs, [grid], 1, S)

    kn = norms[1](k).unflatten(2, (H, -1))
    qn_ = norms[0](q).unflatten(2, (H, -1))

    @torch.no_grad()
    def rotate_only():  # the cached pass's reference keys: rotation of the cached normalised K
        return wa2._rotate(kn, cos, sin, H)

    eq, ek = eager()
    fq, fk = fused()
    fq, fk = fq.unflatten(2, (H, -1)), fk.unflatten(2, (H, -1))
    rk = rotate_only()
    want_rk = ta.rope_apply(kn, grid_sizes, freqs).type_as(kn)
    for name, got, want in (
        ("q", fq, eq),
        ("k", fk, ek),
        ("reference k (rotation only)", rk, want_rk),
    ):
        diff = (got.float() - want.float()).abs()
        mag = want.float().abs().clamp_min(2.0**-126)
        ulps = diff / (torch.finfo(dt).eps * torch.exp2(torch.floor(torch.log2(mag))))
        # the contract: one bf16 rounding of the result plus the fp32 arithmetic's error,
        # a few fp32 roundings of the pair's size (where the rotation cancels, that is many
        # bf16 units of the tiny result)
        src = (qn_ if name == "q" else kn).float()
        pair = (src[..., 0::2].abs() + src[..., 1::2].abs()).repeat_interleave(2, -1)
        excess = (
            diff
            - torch.finfo(dt).eps * torch.exp2(torch.floor(torch.log2(mag)))
            - 3 * torch.finfo(torch.float32).eps * pair
        )
        # with the norm's own rounding: its fp32 statistic summed in another order than torch's
        # RMSNorm kernel may move a normalised value by one bf16 unit, moving the rotated pair
        # by up to one bf16 unit of the pair's size
        excess_norm = excess - torch.finfo(dt).eps * pair
        print(
            f"  {name}: max {ulps.max().item():.2f} ulp, "
            f"{100 * (got == want).float().mean().item():.4f}% "
            f"equal, max |d| {diff.max().item():.3g}; beyond the rotation's contract: "
            f"{int((excess > 0).sum().item())} elements, beyond it with one unit of the norm: "
            f"{int((excess_norm > 0).sum().item())}",
            flush=True,
        )
    for name, x, n in (("q", q, norms[0]), ("k", k, norms[1])):
        with torch.no_grad():
            mine = qk_norm_rope(x, None, q_norm=n, num_heads=H)[0]
            ref = n(x)
        d = (mine.float() - ref.float()).abs()
        ulp_ref = torch.finfo(dt).eps * torch.exp2(
            torch.floor(torch.log2(ref.float().abs().clamp_min(2.0**-126)))
        )
        print(
            f"  norm only, {name}: {100 * (mine == ref).float().mean().item():.4f}% "
            f"equal to torch's RMSNorm, "
            f"max {(d / ulp_ref).max().item():.2f} ulp",
            flush=True,
        )
    if dev != "cuda":
        return  # the CPU check of the comparison above (TRITON_INTERPRET=1, a small grid)
    rows = []
    for name, fn in (
        ("eager (RMSNorm + rope_apply fp64)", eager),
        ("ditfuse qk_norm_rope", fused),
        ("ditfuse tables (once a step)", tables),
        ("ditfuse rotation only (reference K)", rotate_only),
    ):
        us = graph_us(fn)
        rows.append((name, us))
        pct = f"{100 * floor_us / us:5.1f}% of floor" if "qk_norm_rope" in name else ""
        print(f"  {name:40s} {us:9.1f} us  {pct}", flush=True)
    e, f = rows[0][1], rows[1][1]
    print(
        f"  speed-up of the QK call: {e / f:.1f}x (tables once a step over 40 blocks: "
        f"{e / (f + rows[2][1] / 40):.1f}x)",
        flush=True,
    )
    if "--processor" in sys.argv:
        processor_times(ta, H, D, grid, freqs, grid_sizes)
    try:  # torch.compile of the eager code (rope_apply's per-sample loop traced)
        comp = torch.compile(eager)
        comp()
        print(f"  {'torch.compile of the eager code':40s} {graph_us(comp):9.1f} us", flush=True)
    except Exception as err:  # noqa: BLE001 -- report it; the rows above stand
        print(f"  torch.compile of the eager code: failed ({type(err).__name__}: {str(err)[:200]})")


def processor_times(ta, H, D, grid, freqs, grid_sizes):
    """The reference pass's whole self-attention (projections, norms, RoPE, dense SDPA, output
    projection): the base processor against the patched one, do_bench ms."""
    import triton

    from ditfuse.patching.wan_animate2 import _make_processors

    S = math.prod(grid)
    attn = ta.WanAnimate2Attention(dim=H * D, heads=H).to("cuda", torch.bfloat16).eval()
    x = torch.randn(1, S, H * D, device="cuda", dtype=torch.bfloat16)
    kw = dict(rotary_emb=freqs, grid_sizes=grid_sizes, kv_cache_mode="extract")
    procs = {
        "base processor": ta.WanAnimate2AttnProcessor(),
        "patched processor": _make_processors()[ta.WanAnimate2AttnProcessor](),
    }
    outs = {}
    for name, proc in procs.items():
        with torch.no_grad():
            fn = lambda: proc(attn, x, kv_cache=ta.WanAnimate2KVLayerCache(), **kw)  # noqa: E731
            outs[name] = fn()
            ms = triton.testing.do_bench(fn, warmup=3, rep=400)
        print(f"  reference pass self-attention, {name:18s} {ms:8.2f} ms", flush=True)
    a, b = outs.values()
    print(
        f"  outputs: max |d| {(a.float() - b.float()).abs().max().item():.3g} "
        f"(scale {a.float().abs().max().item():.3g})"
    )


if __name__ == "__main__":
    main()
