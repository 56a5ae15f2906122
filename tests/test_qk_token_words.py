"""The per-token kernel's word form (``X_WORDS``): interleaved 16-bit Q / K pairs (2i, 2i+1)
read and written as one 32-bit word, weights / full-width tables a pair a word where they are
pair-aligned (``W_WORDS``, ``T_WORDS``), and rows every head shares (a per-head norm's weight
and bias, a table shared by the heads) read once as [1, pairs] tiles (``Q_W_ROW``,
``K_W_ROW``, ``T_ROW``); calls whose rows are not pair-aligned take the channel form. Where
each form runs, and every element against the fp64 reference."""

import sys
import zlib

import pytest
import torch
from conftest import DEVICE, assert_close_report
from test_qk_norm_rope import make_norm, make_tables

import ditfuse
from ditfuse.norms import NormSpec

pytestmark = pytest.mark.slow  # the slow tier (CONTRIBUTING.md)

mod = sys.modules["ditfuse.ops.qk_norm_rope"]

# (case, heads, head_dim, norm kind, norm span, table kind, rotary_dim or None)
CASES = [
    ("flux-like", 6, 32, "rms", "head", "S,W", None),
    ("diffusers-rms", 5, 32, "rms_roundw", "head", "S,W", None),  # 4 + 1 head pieces
    ("half-table", 3, 64, "rms", "head", "unique", None),
    ("table-bf16", 4, 32, "rms", "head", "bf16", None),
    ("table-per-head", 3, 32, "rms", "head", "S,H,W", None),
    ("positions", 3, 32, "layer", "head", "pos_b", None),
    ("partial-rotary", 3, 80, "rms", "head", "S,W", 48),  # D = 80, 32 channels pass
    ("dyt", 5, 64, "dyt", "head", "S,W", None),
    ("no-affine", 3, 32, "rms_noaffine", "head", "S,W", None),
    ("head-groups", 80, 128, "rms", "head", "S,W", None),  # 10240 channels: head groups
    ("weights-fp32", 3, 32, "rms-fp32", "head", "S,W", None),
    ("weights-unaligned", 3, 32, "rms-unaligned", "head", "S,W", None),
    ("table-unaligned", 3, 32, "rms", "head", "S,W-unaligned", None),
    ("rows-unaligned", 3, 32, "rms", "head", "S,W", None),
    ("strided-heads", 3, 32, "rms", "head", "S,W", None),  # (B, H, S, D) layout
    ("packed-qkv", 3, 32, "rms", "head", "S,W", None),  # chunks of one projection
    ("q-only", 3, 32, "rms", "head", "S,W", None),
    # weights of H*D channels (per-token kernel: partial rotary, which the flat kernel lacks)
    ("across-heads", 3, 32, "rms", "all", "S,W", 16),
    ("layer-across-heads", 5, 32, "layer", "all", "B,S,W", 16),
]


def _shifted(t):
    """``t``'s values at an odd element offset (not aligned to a pair)."""
    big = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    v = big[1:].view(t.shape)
    v.copy_(t)
    return v


def _call(case, H, D, kind, span, table, R, dtype):
    g = torch.Generator().manual_seed(zlib.crc32(f"{case}{dtype}".encode()))
    B, S = 2, 3

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(dtype).to(DEVICE) * 2 + 0.3

    kw = {}
    if case == "strided-heads":
        q, k = randn(B, H, S, D), randn(B, H, S, D)
        kw["layout"] = "bhsd"
    elif case == "packed-qkv":
        buf = randn(B, S, 3 * H * D + 2)
        q = buf[..., : H * D].unflatten(-1, (H, D))
        k = buf[..., H * D : 2 * H * D].unflatten(-1, (H, D))
    else:
        q, k = randn(B, S, H, D), randn(B, S, H, D)
    if case == "rows-unaligned":
        q = _shifted(q)
    if case == "q-only":
        k = None
    base = kind.split("-")[0]
    qn = make_norm(base, span, H, D, dtype, g)
    kn = make_norm(base, span, H, D, dtype, g) if k is not None else None
    if kind == "rms-fp32":
        qn = NormSpec("rms", weight=qn.weight.detach().float(), eps=1e-6)
    if kind == "rms-unaligned":
        qn = NormSpec("rms", weight=_shifted(qn.weight.detach()), eps=1e-6)
    rot = R or D
    cos, sin, tkw = make_tables(table.split("-")[0], B, S, H, rot, "interleaved", g)
    if table.endswith("unaligned"):
        cos, sin = _shifted(cos), _shifted(sin)
    kw.update(tkw, rope_style="interleaved")
    return q, k, cos, sin, qn, kn, kw


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("case,H,D,kind,span,table,R", CASES, ids=[c[0] for c in CASES])
@torch.no_grad()
def test_word_form_where_it_applies(
    case, H, D, kind, span, table, R, dtype, monkeypatch, poison_outputs
):
    """The word form runs exactly where every pair of Q / K and their outputs is an aligned
    word; weights / tables take words only where they are pair-aligned, and a row shared by
    the heads is read once. Every element of Q / K written (outputs start as NaN) and
    within one rounding of the fp64 reference."""
    q, k, cos, sin, qn, kn, kw = _call(case, H, D, kind, span, table, R, dtype)
    monkeypatch.setattr(mod.fastpath, "ENABLED", False)  # every call launches (no replay)
    seen = []
    orig = mod.fastpath.launch
    monkeypatch.setattr(
        mod.fastpath,
        "launch",
        lambda kern, grid, args, kw_: (
            seen.append(
                dict(
                    X_WORDS=kw_.get("X_WORDS", False),
                    W_WORDS=kw_["Q_NORM"].words,
                    T_WORDS=kw_["ROPE"].words,
                    Q_W_ROW=kw_["Q_NORM"].w_row,
                    K_W_ROW=kw_["K_NORM"].w_row,
                    T_ROW=kw_["ROPE"].row,
                )
            ),
            orig(kern, grid, args, kw_),
        )[1],
    )
    got = ditfuse.qk_norm_rope(q, k, cos, sin, q_norm=qn, k_norm=kn, **kw)
    assert len(seen) == 1
    words = seen[0]
    assert words["X_WORDS"] == (case != "rows-unaligned")
    if words["X_WORDS"]:
        has_w = kind not in ("rms_noaffine",)
        assert words["W_WORDS"] == (has_w and kind != "rms-unaligned") or not has_w
        assert words["T_WORDS"] == (table not in ("unique", "S,W-unaligned"))
        # per-head norms: one weight row for every head; the table shared unless per head
        assert words["Q_W_ROW"] == (span == "head" and has_w)
        assert words["K_W_ROW"] == (span == "head" and has_w and k is not None)
        assert words["T_ROW"] == (table != "S,H,W")
    else:
        assert not any(words.values())
    ref = ditfuse.qk_norm_rope_reference(
        q, k, cos, sin, q_norm=qn, k_norm=kn, compute_dtype=torch.float64, **kw
    )
    for a, r, name in zip(got, ref, ("q", "k")):
        if a is None:
            assert r is None
            continue
        assert not a.isnan().any(), f"{case} {name}: an element was not written"
        share = assert_close_report(a, r, dtype, f"{case} {name}")
        assert share >= 0.97, (case, name, share)
