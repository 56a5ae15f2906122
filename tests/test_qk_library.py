"""The torch.library boundary: opcheck, and torch.compile(fullgraph=True) without breaks."""
import pytest
import torch

import ditfuse
from ditfuse import NormSpec, _ops
from conftest import DEVICE, rope_tables

B, S, H, D = 1, 4, 3, 64


def _inputs(dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(5)
    q = torch.randn(B, S, H * D, generator=g).to(dtype).to(DEVICE)
    k = torch.randn(B, S, H * D, generator=g).to(dtype).to(DEVICE)
    cos, sin = rope_tables(S, D)
    w = (torch.randn(H * D, generator=g) + 1).to(dtype).to(DEVICE)
    return q, k, cos, sin, NormSpec("rms", weight=w, eps=1e-6)


def _kw(norm, **extra):
    kw = dict(q_norm=norm, k_norm=norm, num_heads=H, rope_style="interleaved", rotary_dim=None,
              positions=None, round_after_norm=True, layout="bshd")
    kw.update(extra)
    return kw


def test_opcheck_functional():
    q, k, cos, sin, norm = _inputs()
    args = _ops.op_args(q, k, cos, sin, **_kw(norm))
    torch.library.opcheck(torch.ops.ditfuse.qk_norm_rope.default, args)


def test_opcheck_functional_dyt_positions():
    q, k, cos, sin, _ = _inputs(torch.float32)
    g = torch.Generator().manual_seed(1)
    dyt = NormSpec("dyt", weight=torch.randn(D, generator=g).to(DEVICE),
                   bias=torch.randn(D, generator=g).to(DEVICE), alpha=torch.tensor([0.5], device=DEVICE))
    pos = torch.tensor([3, 1, 0, 2], device=DEVICE)
    args = _ops.op_args(q, None, cos, sin, **_kw(dyt, k_norm=None, rope_style="half", positions=pos))
    torch.library.opcheck(torch.ops.ditfuse.qk_norm_rope.default, args)


def test_opcheck_inplace():
    q, k, cos, sin, norm = _inputs()
    args = _ops.op_args(q.clone(), k.clone(), cos, sin, **_kw(norm))
    torch.library.opcheck(torch.ops.ditfuse.qk_norm_rope_.default, args)


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@torch.no_grad()
def test_compile_fullgraph_matches_eager(inplace, backend):
    q, k, cos, sin, norm = _inputs()
    torch._dynamo.reset()

    def f(q, k, cos, sin):
        q = q * 1.5  # surrounding ops so the graph has more than the custom op
        qo, ko = ditfuse.qk_norm_rope(q, k, cos, sin, q_norm=norm, k_norm=norm, num_heads=H,
                                      inplace=inplace)
        return qo + 1, ko

    want = f(q, k.clone(), cos, sin)
    got = torch.compile(f, fullgraph=True, backend=backend)(q, k.clone(), cos, sin)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
