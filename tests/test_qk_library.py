"""The torch.library boundary: opcheck, and torch.compile(fullgraph=True) without breaks."""

import pytest
import torch
from conftest import DEVICE, rope_tables

import ditfuse
from ditfuse import NormSpec
from ditfuse.ops import qk_norm_rope as _ops

B, S, H, D = 1, 4, 3, 64


def _inputs(dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(5)
    q = torch.randn(B, S, H * D, generator=g).to(dtype).to(DEVICE)
    k = torch.randn(B, S, H * D, generator=g).to(dtype).to(DEVICE)
    cos, sin = rope_tables(S, D)
    w = (torch.randn(H * D, generator=g) + 1).to(dtype).to(DEVICE)
    return q, k, cos, sin, NormSpec("rms", weight=w, eps=1e-6)


def _kw(norm, **extra):
    kw = dict(
        q_norm=norm,
        k_norm=norm,
        num_heads=H,
        rope_style="interleaved",
        rotary_dim=None,
        positions=None,
        round_after_norm=True,
        layout="bshd",
    )
    kw.update(extra)
    return kw


def test_opcheck_functional():
    q, k, cos, sin, norm = _inputs()
    args = _ops.op_args(q, k, cos, sin, **_kw(norm))
    torch.library.opcheck(torch.ops.ditfuse.qk_norm_rope.default, args)


def test_opcheck_functional_dyt_positions():
    q, k, cos, sin, _ = _inputs(torch.float32)
    g = torch.Generator().manual_seed(1)
    dyt = NormSpec(
        "dyt",
        weight=torch.randn(D, generator=g).to(DEVICE),
        bias=torch.randn(D, generator=g).to(DEVICE),
        alpha=torch.tensor([0.5], device=DEVICE),
    )
    pos = torch.tensor([3, 1, 0, 2], device=DEVICE)
    args = _ops.op_args(
        q, None, cos, sin, **_kw(dyt, k_norm=None, rope_style="half", positions=pos)
    )
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
        qo, ko = ditfuse.qk_norm_rope(
            q, k, cos, sin, q_norm=norm, k_norm=norm, num_heads=H, inplace=inplace
        )
        return qo + 1, ko

    want = f(q, k.clone(), cos, sin)
    got = torch.compile(f, fullgraph=True, backend=backend)(q, k.clone(), cos, sin)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_opcheck_out():
    q, k, cos, sin, norm = _inputs()
    args = _ops.op_args(q, k, cos, sin, **_kw(norm))
    outs = (torch.empty(B, 2 * S, H * D, dtype=q.dtype, device=DEVICE)[:, S:], torch.empty_like(k))
    torch.library.opcheck(torch.ops.ditfuse.qk_norm_rope_out.default, (*args, *outs))


@torch.no_grad()
def test_compile_out_writes_the_joint_rows_in_place():
    """The joint-attention processors' form: two streams written into their rows of one
    joint Q / K with out=. Compiled, inductor calls the mutating out= op on views of the
    joint buffer (no functional result copied into the rows) and matches eager bitwise."""
    from torch._inductor.utils import run_and_get_code

    q, k, cos, sin, norm = _inputs()
    g = torch.Generator().manual_seed(9)
    T = 3
    tq = torch.randn(B, T, H * D, generator=g).to(q.dtype).to(DEVICE)
    tk = torch.randn(B, T, H * D, generator=g).to(q.dtype).to(DEVICE)
    tcos, tsin = rope_tables(T, D)
    torch._dynamo.reset()

    def f(q, k, tq, tk):
        q_all = q.new_empty(B, T + S, H * D)
        k_all = k.new_empty(B, T + S, H * D)
        ditfuse.qk_norm_rope(
            tq * 2,
            tk,
            tcos,
            tsin,
            q_norm=norm,
            k_norm=norm,
            num_heads=H,
            out=(q_all[:, :T], k_all[:, :T]),
        )
        ditfuse.qk_norm_rope(
            q * 1.5,
            k,
            cos,
            sin,
            q_norm=norm,
            k_norm=norm,
            num_heads=H,
            out=(q_all[:, T:], k_all[:, T:]),
        )
        return q_all + 1, k_all * 2

    want = f(q, k, tq, tk)
    got, code = run_and_get_code(torch.compile(f, fullgraph=True, backend="inductor"), q, k, tq, tk)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    src = "\n".join(code)
    assert src.count("ditfuse.qk_norm_rope_out.default(") == 2
    assert "ditfuse.qk_norm_rope.default(" not in src
