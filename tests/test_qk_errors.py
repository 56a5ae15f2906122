"""Bad input to qk_norm_rope: a clear error naming the argument, before anything is written."""

import pytest
import torch
from conftest import DEVICE, rope_tables

import ditfuse
from ditfuse import NormSpec

B, S, H, D = 2, 4, 3, 64


def _base():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, S, H, D, generator=g).to(torch.bfloat16).to(DEVICE)
    k = torch.randn(B, S, H, D, generator=g).to(torch.bfloat16).to(DEVICE)
    cos, sin = rope_tables(S, D)
    return q, k, cos, sin


def _cases():
    q, k, cos, sin = _base()
    rms = torch.nn.RMSNorm(D).to(DEVICE, torch.bfloat16)
    return [
        ("q int", lambda: (q.to(torch.int32), k, cos, sin, {}), TypeError, "q.dtype"),
        ("k dtype", lambda: (q, k.float(), cos, sin, {}), TypeError, "k.dtype"),
        ("k shape", lambda: (q, k[:, :3], cos, sin, {}), ValueError, "k.shape"),
        ("same tensor", lambda: (q, q, cos, sin, {}), ValueError, "same memory"),
        (
            "odd head_dim",
            lambda: (q[..., :63], k[..., :63], None, None, {}),
            ValueError,
            "head_dim",
        ),
        (
            "head_dim > 256",
            lambda: (
                torch.randn(1, 2, 1, 258).to(DEVICE),
                torch.randn(1, 2, 1, 258).to(DEVICE),
                None,
                None,
                {},
            ),
            ValueError,
            "head_dim",
        ),
        (
            "3-D without num_heads",
            lambda: (q.flatten(2), k.flatten(2), cos, sin, {}),
            ValueError,
            "num_heads",
        ),
        (
            "num_heads not dividing",
            lambda: (q.flatten(2), k.flatten(2), cos, sin, {"num_heads": 5}),
            ValueError,
            "num_heads",
        ),
        ("2-D q", lambda: (q[0, 0], k[0, 0], None, None, {}), ValueError, "must be 4-D"),
        (
            "norm weight size",
            lambda: (q, k, cos, sin, {"q_norm": torch.nn.RMSNorm(H * D + 2).to(DEVICE)}),
            ValueError,
            "q_norm",
        ),
        (
            "norm weight size k",
            lambda: (
                q,
                k,
                cos,
                sin,
                {"k_norm": NormSpec("rms", weight=torch.ones(7, device=DEVICE))},
            ),
            ValueError,
            "k_norm",
        ),
        (
            "unknown norm module",
            lambda: (q, k, cos, sin, {"q_norm": torch.nn.GroupNorm(1, D)}),
            TypeError,
            "q_norm",
        ),
        (
            "weight non-contiguous",
            lambda: (
                q,
                k,
                cos,
                sin,
                {"q_norm": NormSpec("rms", weight=torch.ones(2 * D, device=DEVICE)[::2])},
            ),
            ValueError,
            "contiguous",
        ),
        (
            "dyt alpha shape",
            lambda: (
                q,
                k,
                cos,
                sin,
                {"q_norm": NormSpec("dyt", alpha=torch.ones(3, device=DEVICE))},
            ),
            ValueError,
            "alpha",
        ),
        ("cos without sin", lambda: (q, k, cos, None, {}), ValueError, "both cos and sin"),
        ("cos rows", lambda: (q, k, cos[:3], sin[:3], {}), ValueError, "cos"),
        (
            "cos width",
            lambda: (q, k, cos[:, :40], sin[:, :40], {"rotary_dim": D}),
            ValueError,
            "width",
        ),
        (
            "cos width D/2 ambiguous",
            lambda: (q, k, cos[:, :32], sin[:, :32], {}),
            ValueError,
            "rotary_dim",
        ),
        ("cos dtype", lambda: (q, k, cos.double(), sin.double(), {}), TypeError, "cos.dtype"),
        (
            "cos 5-D",
            lambda: (q, k, cos[None, None, :, None], sin[None, None, :, None], {}),
            ValueError,
            "cos",
        ),
        (
            "cos batch",
            lambda: (q, k, cos[None].expand(3, S, D), sin[None].expand(3, S, D), {}),
            ValueError,
            "cos",
        ),
        ("sin shape differs", lambda: (q, k, cos, sin[None], {}), ValueError, "sin"),
        ("rotary_dim odd", lambda: (q, k, cos, sin, {"rotary_dim": 63}), ValueError, "rotary_dim"),
        (
            "rotary_dim > head_dim",
            lambda: (q, k, cos, sin, {"rotary_dim": 128}),
            ValueError,
            "rotary_dim",
        ),
        (
            "rotary_dim without table",
            lambda: (q, k, None, None, {"rotary_dim": 32}),
            ValueError,
            "rotary_dim",
        ),
        (
            "positions float",
            lambda: (q, k, cos, sin, {"positions": torch.zeros(S, device=DEVICE)}),
            TypeError,
            "positions",
        ),
        (
            "positions shape",
            lambda: (
                q,
                k,
                cos,
                sin,
                {"positions": torch.zeros(S + 1, dtype=torch.long, device=DEVICE)},
            ),
            ValueError,
            "positions",
        ),
        (
            "positions range",
            lambda: (q, k, cos, sin, {"positions": torch.tensor([0, 1, 2, S], device=DEVICE)}),
            ValueError,
            "positions",
        ),
        (
            "positions negative",
            lambda: (q, k, cos, sin, {"positions": torch.tensor([0, -1, 2, 1], device=DEVICE)}),
            ValueError,
            "positions",
        ),
        ("rope_style", lambda: (q, k, cos, sin, {"rope_style": "neox"}), ValueError, "rope_style"),
        ("layout", lambda: (q, k, cos, sin, {"layout": "sbhd"}), ValueError, "layout"),
        (
            "bhsd without layout",
            lambda: (q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), cos, sin, {}),
            ValueError,
            "layout='bhsd'",
        ),
        ("k_norm without k", lambda: (q, None, cos, sin, {"k_norm": rms}), ValueError, "k_norm"),
    ]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
@torch.no_grad()
def test_bad_input_raises_before_writing(case):
    name, build, exc, text = case
    q, k, cos, sin, kw = build()
    snap = [t.clone() for t in (q, k) if isinstance(t, torch.Tensor)]
    with pytest.raises(exc, match=None) as info:
        ditfuse.qk_norm_rope(q, k, cos, sin, inplace=True, **kw)
    assert text in str(info.value), f"{name}: message {str(info.value)!r} does not name {text!r}"
    for before, t in zip(snap, [t for t in (q, k) if isinstance(t, torch.Tensor)]):
        assert torch.equal(before, t), f"{name}: input written before the error"


@pytest.mark.parametrize("form", ["norm only", "q only", "rope only"])
def test_grad_mode_without_grad_inputs_runs(form):
    """Grad enabled but nothing requiring grad (absent tables, K or norms included): the op
    runs and matches its result under no_grad (an absent input once raised the
    inference-only error)."""
    q, k, cos, sin = _base()
    rms = NormSpec("rms", weight=torch.rand(D, device=DEVICE) + 0.5, eps=1e-6)
    args = {
        "norm only": (q, k, None, None, {"q_norm": rms, "k_norm": rms}),
        "q only": (q, None, cos, sin, {"q_norm": rms}),
        "rope only": (q, k, cos, sin, {}),
    }[form]
    assert torch.is_grad_enabled()
    got = ditfuse.qk_norm_rope(args[0], args[1], args[2], args[3], **args[4])
    with torch.no_grad():
        want = ditfuse.qk_norm_rope(args[0], args[1], args[2], args[3], **args[4])
    for g, w in zip(got, want):
        if w is None:
            assert g is None
        else:
            assert torch.equal(g, w)


def test_requires_grad_rejected():
    q, k, cos, sin = _base()
    norm = torch.nn.RMSNorm(D).to(DEVICE, torch.bfloat16)
    with pytest.raises(RuntimeError, match="inference-only"):
        ditfuse.qk_norm_rope(q, k, cos, sin, q_norm=norm)


@torch.no_grad()
def test_three_d_table_readings():
    """A 3-D table that reads as both (B, S, W) and (S, H, W) is refused unless it is one row
    (S = H = 1: both readings give every token and head that row)."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 2, 2, 16, generator=g).to(DEVICE)
    cos, sin = rope_tables(2, 16)
    with pytest.raises(ValueError, match="ambiguous"):
        ditfuse.qk_norm_rope(q, q.clone(), cos[None].expand(2, 2, 16), sin[None].expand(2, 2, 16))
    q1 = torch.randn(3, 1, 1, 16, generator=g).to(DEVICE)
    got = ditfuse.qk_norm_rope(q1, None, cos[:1, None], sin[:1, None])[0]
    want = ditfuse.qk_norm_rope(q1, None, cos[:1], sin[:1])[0]
    assert torch.equal(got, want)
