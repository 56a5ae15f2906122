"""SAME's ``DynamicTanh`` in 16 bits: ``gamma * tanh(alpha * x) + beta`` computed one op at a
time, each result rounded to the activation dtype. ditfuse follows that rounding (a 16-bit
module reads as ``NormSpec(round_before_weight=True)``), so its output equals the module's
bit for bit wherever fp32 tanh's last bits do not move a rounding, within one rounding
elsewhere."""

import pytest
import torch
from conftest import DEVICE

import ditfuse
from ditfuse.ops import attention as A
from ditfuse.tolerances import DYT_MIN_BITWISE

same = pytest.importorskip("diffusers.models.autoencoders.autoencoder_same")

#: share of elements that must equal the module's bit for bit
MIN_BITWISE = DYT_MIN_BITWISE


def _dyt(D, dtype, g):
    m = same.DynamicTanh(D)
    with torch.no_grad():
        m.alpha.fill_(0.8 + 0.4 * torch.rand((), generator=g).item())
        m.gamma.copy_(1 + 0.3 * torch.randn(D, generator=g))
        m.beta.copy_(0.1 * torch.randn(D, generator=g))
    return m.to(DEVICE, dtype)


def _one_rounding(dtype):
    return torch.finfo(dtype).eps  # relative spacing: one rounding is at most half of it, x2 slack


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("rope", [False, True], ids=["norm", "norm+rope"])
@torch.no_grad()
def test_qk_norm_rope_follows_the_module(dtype, rope):
    g = torch.Generator().manual_seed(7)
    B, S, H, D, R = 2, 12, 2, 64, 32
    qn, kn = _dyt(D, dtype, g), _dyt(D, dtype, g)
    q = (torch.randn(B, S, H, D, generator=g) * 1.5).to(DEVICE, dtype)
    k = (torch.randn(B, S, H, D, generator=g) * 1.5).to(DEVICE, dtype)
    eq, ek = qn(q), kn(k)  # the module, eager
    kw = dict(q_norm=qn, k_norm=kn)
    if rope:
        freqs = same.RotaryEmbedding(R).to(DEVICE)(S, q.device)
        eq, ek = same._apply_rotary_partial(eq, freqs), same._apply_rotary_partial(ek, freqs)
        kw.update(cos=freqs.cos(), sin=freqs.sin(), rope_style="half", rotary_dim=R)
    oq, ok = ditfuse.qk_norm_rope(q, k, **kw)
    for out, ref in ((oq, eq), (ok, ek)):
        share = (out == ref).float().mean().item()
        rel = ((out.float() - ref.float()).abs() / ref.float().abs().clamp_min(1e-3)).max().item()
        assert share >= MIN_BITWISE, f"{share:.4f} of the elements equal the module's"
        assert rel <= _one_rounding(dtype), f"max relative difference {rel:.3g}"


def test_attention_prologue_takes_the_same_rounding():
    """The band attention's fused prologue normalises with the same kernel function and the
    same flag: a 16-bit DynamicTanh plans with ``round_pre_w``, an fp32 one without."""
    g = torch.Generator().manual_seed(3)
    for dtype, want in ((torch.bfloat16, True), (torch.float16, True), (torch.float32, False)):
        n = _dyt(64, dtype, g)
        q, k, v = (torch.randn(1, 32, 2, 64, generator=g).to(DEVICE, dtype) for _ in range(3))
        p = A.plan(q, k, v, 5, q_norm=n, k_norm=n)
        assert p.qk.q_norm.round_pre_w is want and p.qk.k_norm.round_pre_w is want
