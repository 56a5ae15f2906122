"""Head-parallel across-heads norm (qk_norm_rope(process_group=...)): two processes on the
gloo backend, each holding half the heads, match the single-process result."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.slow  # the slow tier (CONTRIBUTING.md)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _problem(dtype):
    g = torch.Generator().manual_seed(0)
    B, S, H, D = 2, 3, 4, 32
    q = (torch.randn(B, S, H * D, generator=g) * 2).to(dtype)
    k = torch.randn(B, S, H * D, generator=g).to(dtype)
    wq = (torch.randn(H * D, generator=g) * 0.3 + 1).to(dtype)
    wk = (torch.randn(H * D, generator=g) * 0.3 + 1).to(dtype)
    ang = torch.rand(S, D // 2, generator=g) * 6
    cos = ang.cos().repeat_interleave(2, -1)[None, :, None]
    sin = ang.sin().repeat_interleave(2, -1)[None, :, None]
    return q, k, wq, wk, cos, sin, H, D


def _worker(rank, world, port, dtype, out_dir):
    os.environ["TRITON_INTERPRET"] = "1"
    import ditfuse
    from ditfuse import NormSpec

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    q, k, wq, wk, cos, sin, H, D = _problem(dtype)
    Hl = H // world
    sl = slice(rank * Hl * D, (rank + 1) * Hl * D)
    with torch.no_grad():
        oq, ok = ditfuse.qk_norm_rope(
            q[..., sl].contiguous(),
            k[..., sl].contiguous(),
            cos,
            sin,
            q_norm=NormSpec("rms", weight=wq[sl].contiguous(), eps=1e-6),
            k_norm=NormSpec("rms", weight=wk[sl].contiguous(), eps=1e-6),
            num_heads=Hl,
            process_group=dist.group.WORLD,
        )
    torch.save((oq, ok), os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_two_ranks_match_one(tmp_path, dtype):
    import ditfuse
    from ditfuse import NormSpec
    from ditfuse.tolerances import HEAD_PARALLEL

    world = 2
    mp.spawn(_worker, args=(world, _free_port(), dtype, str(tmp_path)), nprocs=world, join=True)
    q, k, wq, wk, cos, sin, H, D = _problem(dtype)
    with torch.no_grad():
        rq, rk = ditfuse.qk_norm_rope(
            q,
            k,
            cos,
            sin,
            q_norm=NormSpec("rms", weight=wq, eps=1e-6),
            k_norm=NormSpec("rms", weight=wk, eps=1e-6),
            num_heads=H,
        )
    parts = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]
    gq = torch.cat([p[0] for p in parts], -1)
    gk = torch.cat([p[1] for p in parts], -1)
    # identical up to the order of the sum of squares (two partial sums, then one add)
    tol = HEAD_PARALLEL[dtype]._asdict()
    torch.testing.assert_close(gq.float(), rq.float(), **tol)
    torch.testing.assert_close(gk.float(), rk.float(), **tol)
    share = min((gq == rq).float().mean().item(), (gk == rk).float().mean().item())
    print(f"head parallel vs single process, {dtype}: {100 * share:.1f}% bitwise")
    if dtype == torch.bfloat16:
        assert share >= 0.97


def test_process_group_validation():
    import ditfuse
    from ditfuse import NormSpec

    q = torch.randn(1, 2, 64)
    with pytest.raises(ValueError, match="not initialized"):
        with torch.no_grad():
            ditfuse.qk_norm_rope(
                q,
                q.clone(),
                q_norm=NormSpec("rms", weight=torch.ones(64)),
                num_heads=2,
                process_group=object(),
            )
