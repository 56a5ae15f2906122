"""Head-parallel Wan QK-norm + RoPE across ranks.

    torchrun --nproc-per-node 2 -m ditfuse.examples.wan_parallel          # GPUs (NCCL)
    torchrun --nproc-per-node 2 -m ditfuse.examples.wan_parallel --tokens 8   # CPU (gloo)

Each rank holds ``40 / world`` of Wan-14B's heads of a packed QKV projection (random
weights, real size on GPUs: 480p, 32,760 tokens) and normalises across *all* heads with
``qk_norm_rope(..., process_group=...)``: per-rank sums of squares, one all-reduce, apply.
Rank 0 gathers the result, checks it against the single-rank computation and prints the
time per call (CUDA events, median) next to the one-rank time.
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch
import torch.distributed as dist


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--tokens", type=int, default=None, help="S (default: 32760 on GPU, 8 on CPU)")
    ap.add_argument("--heads", type=int, default=40)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import ditfuse
    from ditfuse import NormSpec

    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda" if cuda else "cpu")
    H, D = args.heads, args.head_dim
    S = args.tokens or (21 * 30 * 52 if cuda else 8)
    if H % world:
        raise SystemExit(f"--heads {H} must divide by the world size {world}")
    Hl = H // world
    g = torch.Generator(device=dev).manual_seed(0)  # every rank draws the same full problem
    qkv = torch.randn(1, S, 3 * H * D, generator=g, device=dev).to(torch.bfloat16)
    wq = (torch.randn(H * D, generator=g, device=dev) * 0.2 + 1).to(torch.bfloat16)
    wk = (torch.randn(H * D, generator=g, device=dev) * 0.2 + 1).to(torch.bfloat16)
    ang = torch.arange(S, device=dev)[:, None] * torch.rand(D // 2, generator=g, device=dev)
    cos = ang.cos().repeat_interleave(2, -1)[None, :, None].float()
    sin = ang.sin().repeat_interleave(2, -1)[None, :, None].float()
    shard = slice(rank * Hl * D, (rank + 1) * Hl * D)
    q0, k0 = qkv[..., : H * D], qkv[..., H * D : 2 * H * D]
    local = torch.cat(
        [q0[..., shard], k0[..., shard], qkv[..., 2 * H * D :][..., shard]], -1
    ).contiguous()
    norms = [NormSpec("rms", weight=w, eps=1e-6) for w in (wq, wk)]  # all heads
    local_norms = [NormSpec("rms", weight=w[shard].contiguous(), eps=1e-6) for w in (wq, wk)]

    def norm_rope(qkv, heads, qk_norms, **kw):
        """QK-norm (across the ``heads`` heads) + RoPE of packed ``qkv``'s Q and K columns."""
        n, (q_norm, k_norm) = heads * D, qk_norms
        q, k = qkv[..., :n], qkv[..., n : 2 * n]
        return ditfuse.qk_norm_rope(
            q, k, cos, sin, q_norm=q_norm, k_norm=k_norm, num_heads=heads, **kw
        )

    def step(buf):
        norm_rope(buf, Hl, local_norms, inplace=True, process_group=dist.group.WORLD)

    with torch.no_grad():
        out = local.clone()
        step(out)
        full_q, full_k = norm_rope(qkv, H, norms)
        err = max(
            (out[..., : Hl * D].float() - full_q[..., shard].float()).abs().max().item(),
            (out[..., Hl * D : 2 * Hl * D].float() - full_k[..., shard].float()).abs().max().item(),
        )
        same = torch.equal(out[..., : Hl * D], full_q[..., shard])
        times, times1 = [], []
        if cuda:
            for _ in range(args.iters):
                buf = local.clone()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                dist.barrier()
                s.record()
                step(buf)
                e.record()
                torch.cuda.synchronize()
                times.append(s.elapsed_time(e) * 1e3)
                full = qkv.clone()
                s.record()
                norm_rope(full, H, norms, inplace=True)
                e.record()
                torch.cuda.synchronize()
                times1.append(s.elapsed_time(e) * 1e3)
    errs = [torch.tensor([err], device=dev)]
    dist.all_reduce(errs[0], op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"world {world}: S={S}, {H} heads x {D} ({Hl} a rank), bf16, packed QKV in place")
        print(
            f"max |head-parallel - single rank| = {errs[0].item():.3g} "
            f"({'bitwise on rank 0' if same else 'up to the reduction order'})"
        )
        if cuda:
            print(
                f"time per call: {statistics.median(times):.1f} us on {world} GPUs (this rank's "
                f"{Hl} heads + all-reduce); {statistics.median(times1):.1f} us for all {H} heads "
                "on one GPU"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
