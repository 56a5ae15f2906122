"""The persistent TMA-fed QK-norm + RoPE kernel: where it applies (and where it must not),
bitwise against the per-token kernel under the interpreter (same arithmetic, same order),
every item written once (poisoned outputs), in place with V untouched, several head groups
per token and several items per program."""
import itertools
import sys
import zlib

import pytest
import torch

import ditfuse
from conftest import DEVICE
from test_qk_norm_rope import make_norm, make_qk, make_tables

mod = sys.modules["ditfuse.ops.qk_norm_rope"]

NORMS = ["rms", "rms_noaffine", "layer", "dyt", "rms_roundw"]
CASES = list(itertools.product(
    NORMS, ["head", "all"], ["interleaved", "half"],
    [(3, 64), (5, 32), (6, 16), (1, 128)],
    ["S,W", "1,S,1,W", "B,S,1,W", "unique", "bf16"],
    ["bshd", "flat", "packed", "bhsd"]))
# one case per combination of the axes that matter most, rotating through the rest
PICK = [c for i, c in enumerate(CASES) if i % 29 == 0]


def _plan_and_ref(norm, span, style, hd, table, form, dtype=torch.bfloat16, B=2, S=5):
    H, D = hd
    g = torch.Generator().manual_seed(zlib.crc32(f"{norm}{span}{style}{hd}{table}{form}".encode()))
    q, k, kw, buf = make_qk(form, B, S, H, D, dtype, g)
    qn = make_norm(norm, span, H, D, dtype, g)
    kn = make_norm(norm, span, H, D, dtype, g)
    cos, sin, tkw = make_tables(table, B, S, H, D, style, g)
    if "num_heads" not in kw:
        kw["num_heads"] = None
    p = mod.plan(q, k, cos, sin, q_norm=qn, k_norm=kn, rope_style=style, **kw, **tkw)
    return p


@pytest.mark.parametrize("norm,span,style,hd,table,form", PICK)
@torch.no_grad()
def test_tma_equals_per_token_kernel(norm, span, style, hd, table, form):
    p = _plan_and_ref(norm, span, style, hd, table, form)
    assert mod.tma_applies(p), "case meant for the TMA kernel"
    hg, _, _, nw, _, _ = mod.tma_settings(p.q.shape[2], p.q.shape[3], p.q.element_size(), True,
                                          span == "all")
    ref_q, ref_k = torch.empty_like(p.q), torch.empty_like(p.k)
    mod.launch(p, ref_q, ref_k, settings=(hg, nw))  # settings: the per-token kernel
    qo = torch.full_like(p.q, float("nan"))
    ko = torch.full_like(p.k, float("nan"))
    mod.launch_tma(p, qo, ko)
    _same_or_one_rounding(qo, ref_q)
    _same_or_one_rounding(ko, ref_k)


def _same_or_one_rounding(got, want):
    """Bitwise under the interpreter (one summation order). On a GPU the register layout of
    a tile (TMA box vs pointer load) may order a norm's sums differently: then within one
    rounding of the activation dtype, every element finite."""
    if DEVICE == "cpu":
        assert torch.equal(got, want)
        return
    assert torch.isfinite(got.float()).all()
    ulp = torch.finfo(got.dtype).eps * want.float().abs().clamp_min(1e-3)
    assert ((got.float() - want.float()).abs() <= ulp).all()


@pytest.mark.parametrize("settings", [(2, 8, 3, 1), (3, 8, 2, 2), (5, 8, 4, 1), (1, 4, 1, 3)])
@torch.no_grad()
def test_head_groups_and_items_per_program(settings):
    """Heads split into groups (the last one ragged, a second piece hanging over H), a few
    programs each walking many items: the same bits as the per-token kernel."""
    p = _plan_and_ref("rms", "head", "interleaved", (5, 32), "S,W", "bshd", B=2, S=7)
    hg = settings[0]
    ref_q, ref_k = torch.empty_like(p.q), torch.empty_like(p.k)
    mod.launch(p, ref_q, ref_k, settings=(hg, 4))
    qo = torch.full_like(p.q, float("nan"))
    ko = torch.full_like(p.k, float("nan"))
    mod.launch_tma(p, qo, ko, settings=settings)
    _same_or_one_rounding(qo, ref_q)
    _same_or_one_rounding(ko, ref_k)


@torch.no_grad()
def test_public_call_takes_tma_in_place_q_only():
    """Without the flat-row kernel, the public function routes to the TMA kernel where it pays (a norm across >= 4096
    channels with 8 per-token warps: in place on a packed projection, V and the pad channels
    untouched), with the per-token kernel's bits; Q alone stays per token."""
    calls = []
    orig = mod.launch_tma
    g = torch.Generator().manual_seed(5)
    H, D, S = 40, 128, 2
    buf = torch.randn(1, S, 3 * H * D + 8, generator=g).to(torch.bfloat16).to(DEVICE)
    cos, sin, _ = make_tables("S,W", 1, S, H, D, "interleaved", g)
    norm = make_norm("rms", "all", H, D, torch.bfloat16, g)
    mod.USE_FLAT = False  # the flat-row kernel takes these calls first (test_qk_flat.py)
    want = buf.clone()
    ditfuse.qk_norm_rope(want[..., :H * D], want[..., H * D:2 * H * D], cos, sin, q_norm=norm,
                         k_norm=norm, num_heads=H, inplace=True)
    try:
        mod.launch_tma = lambda *a, **k: (calls.append(1), orig(*a, **k))
        mod.USE_TMA = False
        per_token = buf.clone()
        ditfuse.qk_norm_rope(per_token[..., :H * D], per_token[..., H * D:2 * H * D], cos, sin,
                             q_norm=norm, k_norm=norm, num_heads=H, inplace=True)
        assert not calls
        mod.USE_TMA = True
        got = buf.clone()
        ditfuse.qk_norm_rope(got[..., :H * D], got[..., H * D:2 * H * D], cos, sin, q_norm=norm,
                             k_norm=norm, num_heads=H, inplace=True)
        assert calls
        # Q alone: the per-token table runs 4 warps there, so the per-token kernel (tma_pays)
        qonly = ditfuse.qk_norm_rope(buf[..., :H * D], None, cos, sin, q_norm=norm, num_heads=H)[0]
        assert len(calls) == 1
    finally:
        mod.launch_tma = orig
        mod.USE_TMA = True
        mod.USE_FLAT = True
    _same_or_one_rounding(got, per_token)
    assert torch.equal(got, want)
    assert torch.equal(got[..., 2 * H * D:], buf[..., 2 * H * D:])
    _same_or_one_rounding(qonly, got[..., :H * D])


@pytest.mark.parametrize("why", ["D=80", "partial", "positions", "per-head table",
                                 "channel stride", "misaligned base", "row stride",
                                 "misaligned table"])
@torch.no_grad()
def test_where_tma_does_not_apply(why):
    """Cases the TMA cannot take go to the per-token kernel (and still compute correctly)."""
    g = torch.Generator().manual_seed(9)
    H, D, S, B = 3, 32, 5, 1
    dt = torch.bfloat16

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dt).to(DEVICE)

    q, k = rnd(B, S, H, D), rnd(B, S, H, D)
    cos, sin, kw = make_tables("S,W", B, S, H, D, "interleaved", g)
    if why == "D=80":
        D = 80
        q, k = rnd(B, S, H, D), rnd(B, S, H, D)
        cos, sin, kw = make_tables("S,W", B, S, H, D, "interleaved", g)
    elif why == "partial":
        cos, sin, kw = make_tables("S,W", B, S, H, D // 2, "interleaved", g)
    elif why == "positions":
        cos, sin, kw = make_tables("pos", B, S, H, D, "interleaved", g)
    elif why == "per-head table":
        cos, sin, kw = make_tables("S,H,W", B, S, H, D, "interleaved", g)
    elif why == "channel stride":
        q, k = rnd(B, S, H, 2 * D)[..., ::2], rnd(B, S, H, 2 * D)[..., ::2]
    elif why == "misaligned base":
        q = rnd(B * S * H * D + 1)[1:].view(B, S, H, D)
    elif why == "row stride":  # 3*D + 1 elements a head: not a 16-byte multiple
        q = rnd(B, S, H, D + 1)[..., :D]
    elif why == "misaligned table":
        c2 = torch.randn(S * D + 1, generator=g).to(DEVICE)[1:].view(S, D)  # 4 bytes off
        cos, sin = c2, sin
    norm = make_norm("rms", "head", H, D, dt, g)
    p = mod.plan(q, k, cos, sin, q_norm=norm, k_norm=norm, **kw)
    assert not mod.tma_applies(p)
    calls = []
    orig = mod.launch_tma
    try:
        mod.launch_tma = lambda *a, **k: calls.append(1)
        out = ditfuse.qk_norm_rope(q, k, cos, sin, q_norm=norm, k_norm=norm, **kw)
    finally:
        mod.launch_tma = orig
    assert not calls
    assert torch.isfinite(out[0].float()).all() and torch.isfinite(out[1].float()).all()


def test_tma_pays_only_for_wide_norms_across_heads():
    from ditfuse.tools.shapes import QK_SHAPES
    from ditfuse.tools.workloads import qk_inputs

    want = {"wan14b-480p": True, "wan14b-720p": True, "wan1.3b-480p": False, "flux1-1024": False,
            "flux2-1024": False, "qwen-image-1328": False, "hunyuan-video-544p": False}
    for name, pays in want.items():
        inp = qk_inputs(QK_SHAPES[name].small(2), "cpu", torch.bfloat16)
        p = mod.plan(inp["q"], inp["k"], inp["cos"], inp["sin"], q_norm=inp["q_norm"],
                     k_norm=inp["k_norm"], **inp["kwargs"])
        assert mod.tma_pays(p) is pays, name
    # rotate-half pairs with a norm across heads: the per-token kernel (on the H200 the two
    # kernels' bits differed there), with a table or without
    from ditfuse.norms import NormSpec

    H, D, S = 40, 128, 2
    x = torch.randn(1, S, H * D).to(torch.bfloat16)
    n = NormSpec("rms", weight=torch.ones(H * D, dtype=torch.bfloat16), eps=1e-6)
    c, s_ = torch.randn(S, D), torch.randn(S, D)
    half = mod.plan(x, x.clone(), c, s_, q_norm=n, k_norm=n, num_heads=H, rope_style="half")
    assert not mod.tma_pays(half)
    assert mod.tma_pays(mod.plan(x, x.clone(), None, None, q_norm=n, k_norm=n, num_heads=H))
