"""The flat-row QK-norm + RoPE kernel (norms across heads, interleaved RoPE over whole heads):
where it applies (and where it must not), against the fp64 reference, Q/K split and together
bitwise, every element written (poisoned outputs), in place with V untouched, strided
(non-contiguous rows) and padded pieces, and its pair form (16-bit rows a pair a word)
where it applies."""

import itertools
import sys
import zlib

import pytest
import torch
from conftest import DEVICE, DTYPES, assert_close_report
from test_qk_norm_rope import make_norm, make_qk, make_tables

import ditfuse
from ditfuse.norms import NormSpec

mod = sys.modules["ditfuse.ops.qk_norm_rope"]

NORMS = ["rms", "rms_noaffine", "layer", "dyt", "rms_roundw", None]
TABLES = ["S,W", "1,S,1,W", "B,S,1,W", "S,H,W", "unique", "pos_b", "bf16", None]
FORMS = ["flat", "packed", "bshd", "bhsd", "strided_d"]
# H*D: 192 = 128 + 64, 160 = 128 + 32, 224 = 128 + 128 (a masked second piece), 64 (one
# piece), 5120 (Wan 14B: 4096 + 1024, Q and K split), 96 = 64 + 32 with D = 16
HEAD_SHAPES = [(3, 64), (5, 32), (7, 32), (1, 64), (40, 128), (6, 16)]


def _cases():
    out = []
    for i, (kind, dtype, hd) in enumerate(itertools.product(NORMS, DTYPES, HEAD_SHAPES)):
        table = TABLES[i % len(TABLES)]
        form = FORMS[(i // 3) % len(FORMS)]
        B = 1 + i % 2
        inplace = i % 4 == 1
        out.append(
            pytest.param(
                kind,
                dtype,
                hd,
                table,
                form,
                B,
                inplace,
                id=f"{kind}-{str(dtype)[6:]}-{hd[0]}x{hd[1]}-{table}-{form}-B{B}"
                f"{'-inplace' if inplace else ''}",
            )
        )
    return out


def _inputs(kind, dtype, hd, table, form, B, S=3):
    H, D = hd
    g = torch.Generator().manual_seed(zlib.crc32(f"{kind}{dtype}{hd}{table}{form}{B}".encode()))
    q, k, kw, buf = make_qk(form, B, S, H, D, dtype, g)
    qn = make_norm(kind, "all", H, D, dtype, g)
    kn = make_norm(kind, "all", H, D, dtype, g)
    cos = sin = None
    if table is not None:
        cos, sin, tkw = make_tables(table, B, S, H, D, "interleaved", g)
        kw.update(tkw, rope_style="interleaved")
    return q, k, cos, sin, qn, kn, kw, buf


@pytest.fixture
def flat_calls(monkeypatch):
    calls = []
    orig = mod.launch_flat
    monkeypatch.setattr(mod, "launch_flat", lambda *a, **k: (calls.append(1), orig(*a, **k))[1])
    return calls


@pytest.mark.parametrize("kind,dtype,hd,table,form,B,inplace", _cases())
@torch.no_grad()
def test_flat_against_reference(
    kind, dtype, hd, table, form, B, inplace, poison_outputs, flat_calls
):
    q, k, cos, sin, qn, kn, kw, buf = _inputs(kind, dtype, hd, table, form, B)
    ref_q, ref_k = ditfuse.qk_norm_rope_reference(
        q, k, cos, sin, q_norm=qn, k_norm=kn, compute_dtype=torch.float64, **kw
    )
    buf_before = buf.clone() if buf is not None else None
    q_in, k_in = q.clone(), k.clone()
    out_q, out_k = ditfuse.qk_norm_rope(q, k, cos, sin, q_norm=qn, k_norm=kn, inplace=inplace, **kw)
    assert flat_calls, "the flat-row kernel did not run"
    if inplace:
        assert out_q.data_ptr() == q.data_ptr() and out_k.data_ptr() == k.data_ptr()
        if buf is not None:  # V and the pad channels of the packed projection untouched
            HD = hd[0] * hd[1]
            assert torch.equal(buf[..., 2 * HD :], buf_before[..., 2 * HD :])
    else:
        assert torch.equal(q, q_in) and torch.equal(k, k_in), "inputs changed without inplace"
    for got, ref, name in ((out_q, ref_q, "q"), (out_k, ref_k, "k")):
        assert not got.isnan().any(), f"{name}: an element was not written"
        share = assert_close_report(got, ref, dtype, name)
        if dtype != torch.float32:  # the fp64 reference rounds where the kernel rounds
            assert share >= 0.97, (name, share)


@pytest.mark.parametrize(
    "hd,dtype", [((40, 128), torch.bfloat16), ((7, 32), torch.float16), ((3, 64), torch.float32)]
)
@torch.no_grad()
def test_split_and_warps_do_not_change_bits(hd, dtype):
    """Q and K in programs of their own or together: the same bits at the same warps (each
    tensor's arithmetic is the same program body); other warps order the cross-warp sum of
    squares differently: within the dtype's tolerance (on the H200 fp32 moves an ulp;
    the interpreter has no warps); every element written."""
    q, k, cos, sin, qn, kn, kw, _ = _inputs("rms", dtype, hd, "1,S,1,W", "flat", 2)
    p = mod.plan(q, k, cos, sin, q_norm=qn, k_norm=kn, **kw)
    assert mod.flat_applies(p, p.q, p.k)
    outs = {}
    for warps in (1, 2, 4, 8):
        for split in (True, False):
            qo = torch.full_like(p.q, float("nan"))
            ko = torch.full_like(p.k, float("nan"))
            mod.launch_flat(p, qo, ko, num_warps=warps, split=split)
            assert not qo.isnan().any() and not ko.isnan().any()
            outs[warps, split] = (qo, ko)
        for a, b in zip(outs[warps, True], outs[warps, False]):
            assert torch.equal(a, b), f"split vs together at {warps} warps"
        for a, b in zip(outs[warps, True], outs[1, True]):
            assert_close_report(a, b, dtype, f"{warps} warps vs 1")


@pytest.mark.slow
@pytest.mark.parametrize(
    "hd", [(40, 128), (7, 32), (6, 16), (3, 64)], ids=lambda h: f"{h[0]}x{h[1]}"
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("table", ["S,W/2", "wan-views", "B,S,1,W/2", "S,H,W/2", "pos"])
@torch.no_grad()
def test_half_table_is_its_repeat_interleaved_table(hd, dtype, table, flat_calls, poison_outputs):
    """A half-width table (one column a pair: Wan's ``cos[..., 0::2]`` / ``sin[..., 1::2]``
    views, complex frequencies) takes one cos and one sin load a pair; the result is bitwise
    the call with the same values repeated for both channels of each pair. Random tables
    (not rotations), masked second pieces (7 x 32 = 128 + 128 lanes for 224 channels), every
    element written."""
    H, D = hd
    B, S = 2, 3
    g = torch.Generator().manual_seed(H * 1000 + D)
    q, k, kw, _ = make_qk("flat", B, S, H, D, dtype, g)
    qn = make_norm("rms", "all", H, D, dtype, g)
    kn = make_norm("rms", "all", H, D, dtype, g)

    def rnd(*shape):
        return (torch.rand(*shape, generator=g, dtype=torch.float64) * 2 - 1).float().to(DEVICE)

    if table == "wan-views":  # (1, S, 1, D) tables whose pair columns differ: Wan reads 0::2 / 1::2
        cf, sf = rnd(1, S, 1, D), rnd(1, S, 1, D)
        ch, sh = cf[..., 0::2], sf[..., 1::2]
    elif table == "S,W/2":
        ch, sh = rnd(S, D // 2), rnd(S, D // 2)
    elif table == "S,H,W/2":  # per head
        ch, sh = rnd(S, H, D // 2), rnd(S, H, D // 2)
    elif table == "pos":  # rows gathered by positions
        ch, sh = rnd(S + 4, D // 2), rnd(S + 4, D // 2)
        kw["positions"] = torch.randint(0, S + 4, (B, S), generator=g).to(DEVICE)
    else:
        ch, sh = rnd(B, S, 1, D // 2), rnd(B, S, 1, D // 2)
    full = [t.repeat_interleave(2, dim=-1) for t in (ch, sh)]
    kw.update(rope_style="interleaved", rotary_dim=D)
    got = ditfuse.qk_norm_rope(q, k, ch, sh, q_norm=qn, k_norm=kn, **kw)
    assert flat_calls
    want = ditfuse.qk_norm_rope(q, k, *full, q_norm=qn, k_norm=kn, **kw)
    for a, b in zip(got, want):
        assert not a.isnan().any()
        assert torch.equal(a, b)
    ref = ditfuse.qk_norm_rope_reference(
        q, k, *full, q_norm=qn, k_norm=kn, compute_dtype=torch.float64, **kw
    )
    for a, r in zip(got, ref):
        assert_close_report(a, r, dtype)


@torch.no_grad()
def test_q_only_and_single_token():
    """k=None (Q alone) and S = 1, B = 3."""
    H, D, dtype = 5, 32, torch.bfloat16
    q, k, cos, sin, qn, kn, kw, _ = _inputs("rms", dtype, (H, D), "S,W", "bshd", 3, S=1)
    out, none = ditfuse.qk_norm_rope(q, None, cos, sin, q_norm=qn, **kw)
    assert none is None
    ref, _ = ditfuse.qk_norm_rope_reference(
        q, None, cos, sin, q_norm=qn, compute_dtype=torch.float64, **kw
    )
    assert_close_report(out, ref, dtype)


@pytest.mark.parametrize(
    "why", ["per-head norm", "rotate-half", "partial rotary", "D=80", "too wide", "mixed spans"]
)
@torch.no_grad()
def test_flat_does_not_apply(why):
    """Where the flat kernel does not compute the call, the per-token kernel does."""
    H, D, style, span, R = 3, 64, "interleaved", "all", None
    if why == "D=80":
        D = 80
    if why == "too wide":
        H, D = 100, 128  # 12800 channels > FLAT_MAX_CHANNELS
    if why == "rotate-half":
        style = "half"
    if why == "partial rotary":
        R = 32
    if why == "per-head norm":
        span = "head"
    g = torch.Generator().manual_seed(1)
    dtype = torch.bfloat16
    q = torch.randn(1, 2, H, D, generator=g).to(dtype).to(DEVICE)
    k = torch.randn(1, 2, H, D, generator=g).to(dtype).to(DEVICE)
    qn = make_norm("rms", span, H, D, dtype, g)
    kn = make_norm("rms", "head" if why == "mixed spans" else span, H, D, dtype, g)
    cos, sin, tkw = make_tables("S,W", 1, 2, H, R or D, style, g)
    p = mod.plan(q, k, cos, sin, q_norm=qn, k_norm=kn, rope_style=style, **tkw)
    assert not mod.flat_applies(p, p.q, p.k)


def test_flat_settings_table():
    """Two power-of-two pieces covering the token (the second masked only where it passes
    it), Q and K in programs of their own, about 80 live channels a thread."""

    def table(H, D, has_k, itemsize=2):
        st = mod.launch_settings(H, D, flat=True, has_k=has_k, itemsize=itemsize)
        return (st.piece0, st.piece1, st.mask0, st.mask1, st.num_warps, st.split_qk)

    assert table(40, 128, True) == (4096, 1024, False, False, 2, True)
    assert table(24, 128, True) == (2048, 1024, False, False, 2, True)
    assert table(12, 128, True) == (1024, 512, False, False, 1, True)
    assert table(7, 32, True) == (128, 128, False, True, 1, True)
    assert table(40, 128, True, 4) == (4096, 1024, False, False, 1, True)  # fp32
    assert table(1, 64, False) == (64, 0, False, False, 1, False)
    for H, D in itertools.product((1, 3, 5, 12, 24, 40, 48, 96), (16, 32, 64, 128)):
        if H * D > mod.FLAT_MAX_CHANNELS:
            continue
        n0, n1, m0, m1, warps, split = table(H, D, True)
        # piece 0 the largest power of two in the token, piece 1 the rest rounded up
        assert n0 & (n0 - 1) == 0 and n0 <= H * D <= n0 + n1 and not m0
        assert (n1 == 0) == (n0 == H * D) and (n1 == 0 or n1 & (n1 - 1) == 0)
        assert m1 == (n0 + n1 > H * D) and 1 <= warps <= 8


def test_flat_falls_back_where_offsets_need_64_bits():
    """A (B, H, S, D) view at 2^26 tokens x 32 heads x 128 has head offsets past 2^31: the
    flat kernel (32-bit offsets within a token) does not take it; the per-token kernel's
    64-bit variant does (``test_64_bit_token_offsets_same_bits``)."""
    meta = torch.empty(1, 32, 2**26, 128, device="meta", dtype=torch.bfloat16)
    p = mod.plan(meta, None, layout="bhsd")
    assert not mod.flat_applies(p, p.q, None)
    small = torch.empty(1, 32, 4, 128, device="meta", dtype=torch.bfloat16)
    p = mod.plan(small, None, layout="bhsd")
    assert mod.flat_applies(p, p.q, None)


def _shifted(t):
    """``t``'s values in a buffer one element further on: a view whose start is not aligned
    to a (2i, 2i+1) pair."""
    big = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    v = big[1:].view(t.shape)
    v.copy_(t)
    return v


def _form_seen(monkeypatch):
    """Every call launches (no replay); the returned list collects whether each flat launch
    took the pair form."""
    monkeypatch.setattr(mod.fastpath, "ENABLED", False)
    seen = []
    orig = mod.fastpath.launch
    monkeypatch.setattr(
        mod.fastpath,
        "launch",
        lambda kern, grid, args, kw_: (
            seen.append(kw_.get("PAIRS", False)),
            orig(kern, grid, args, kw_),
        )[1],
    )
    return seen


def _check_against_reference(got, q, k, cos, sin, qn, kn, kw, dtype, what):
    ref = ditfuse.qk_norm_rope_reference(
        q, k, cos, sin, q_norm=qn, k_norm=kn, compute_dtype=torch.float64, **kw
    )
    for a, r, name in zip(got, ref, ("q", "k")):
        assert not a.isnan().any(), f"{what} {name}: an element was not written"
        share = assert_close_report(a, r, dtype, f"{what} {name}")
        assert share >= 0.97, (what, name, share)


@pytest.mark.parametrize(
    "case",
    [
        "aligned",
        "weights-fp32",
        "weights-unaligned",
        "table-bf16",
        "table-unaligned",
        "half-table",
        "masked-piece",
        "rows-unaligned",
        "layer-bias",
        "dyt",
        "no-rope",
        "fp16",
        "qk-norms-differ",
    ],
)
@torch.no_grad()
def test_pair_form_where_it_applies(case, monkeypatch, poison_outputs):
    """The flat kernel's pair form (16-bit rows read, held and written a (2i, 2i+1) pair a
    32-bit word) runs where Q and K have programs of their own, every row is pair-aligned
    and Q's and K's norms are one kernel body; weights / tables are read a pair a word where
    they are pair-aligned (else a value at a time); rows not pair-aligned, and Q / K norms
    of different kinds or operand dtypes, take the channel form. Each call against the fp64
    reference, every element written."""
    dtype = torch.float16 if case == "fp16" else torch.bfloat16
    hd = (7, 32) if case == "masked-piece" else (40, 128) if case == "qk-norms-differ" else (5, 32)
    kind = {"layer-bias": "layer", "dyt": "dyt"}.get(case, "rms")
    table = (
        None
        if case == "no-rope"
        else ("S,W/2" if case == "half-table" else "bf16" if case == "table-bf16" else "S,W")
    )
    if table == "S,W/2":
        q, k, _, _, qn, kn, kw, _ = _inputs(kind, dtype, hd, None, "flat", 2)
        g = torch.Generator().manual_seed(3)
        cos = torch.rand(3, hd[1] // 2, generator=g).to(DEVICE)
        sin = torch.rand(3, hd[1] // 2, generator=g).to(DEVICE)
        kw.update(rope_style="interleaved", rotary_dim=hd[1])
    else:
        q, k, cos, sin, qn, kn, kw, _ = _inputs(kind, dtype, hd, table, "flat", 2)
    if case == "qk-norms-differ":  # Q and K in programs of their own, different bodies
        kn = make_norm("layer", "all", *hd, dtype, torch.Generator().manual_seed(9))
    if case == "weights-fp32":
        qn = NormSpec("rms", weight=qn.weight.detach().float(), eps=1e-6)
    if case == "weights-unaligned":
        qn = NormSpec("rms", weight=_shifted(qn.weight.detach()), eps=1e-6)
    if case == "table-unaligned":
        cos, sin = _shifted(cos), _shifted(sin)
    if case == "rows-unaligned":
        q = _shifted(q)
    p = mod.plan(q, k, cos, sin, q_norm=qn, k_norm=kn, **kw)
    assert mod.flat_applies(p, p.q, p.k)
    row_contig = True
    assert mod.pairs_applies(p, p.q, p.k, row_contig) == (case != "rows-unaligned")
    if case == "weights-unaligned":
        assert not mod._words_ok(mod._norm_tensors(p))
    if case == "table-unaligned":
        assert not mod._words_ok([p.cos, p.sin])
    if case in ("aligned", "weights-fp32", "table-bf16"):  # a pair a word for every operand
        assert mod._words_ok(mod._norm_tensors(p)) and mod._words_ok([p.cos, p.sin])
    seen = _form_seen(monkeypatch)
    got = ditfuse.qk_norm_rope(q, k, cos, sin, q_norm=qn, k_norm=kn, **kw)
    # rows not pair-aligned, and Q / K norms of different kinds or operand dtypes (not one
    # kernel body), take the channel form
    pair = case not in ("rows-unaligned", "qk-norms-differ", "weights-fp32")
    assert seen == [pair]
    _check_against_reference(got, q, k, cos, sin, qn, kn, kw, dtype, case)


@pytest.mark.slow
@pytest.mark.parametrize("i", range(24), ids=[f"case{i}" for i in range(24)])
@torch.no_grad()
def test_pair_form_fuzz(i, monkeypatch, poison_outputs):
    """Randomly drawn calls the flat kernel takes in its pair form (norms across heads or
    none, whole-head interleaved rotation or none, every table form, 16-bit, batch and
    token counts from 1, the normalised value rounded or not, new / in place), against the
    fp64 reference, every element written."""
    import random

    r = random.Random(7000 + i)
    dtype = r.choice([torch.bfloat16, torch.float16])
    H, D = r.choice([(1, 16), (2, 64), (3, 32), (5, 32), (7, 32), (12, 16), (4, 128), (6, 8)])
    B, S = r.choice([1, 2, 3]), r.choice([1, 2, 5])
    kind = r.choice(["rms", "rms_noaffine", "layer", "dyt", "rms_roundw", None])
    table = r.choice(["S,W", "1,S,1,W", "B,S,1,W", "S,H,W", "unique", "pos_b", "bf16", None])
    form = r.choice(["flat", "packed", "bshd"])
    q, k, cos, sin, qn, kn, kw, _ = _inputs(kind, dtype, (H, D), table, form, B, S)
    kw["round_after_norm"] = r.random() < 0.8
    inplace = r.random() < 0.3
    p = mod.plan(q, k, cos, sin, q_norm=qn, k_norm=kn, **kw)
    assert mod.flat_applies(p, p.q, p.k)
    assert mod.pairs_applies(p, p.q, p.k, True)
    seen = _form_seen(monkeypatch)
    q_in, k_in = q.clone(), k.clone()
    got = ditfuse.qk_norm_rope(q, k, cos, sin, q_norm=qn, k_norm=kn, inplace=inplace, **kw)
    assert seen == [True]
    _check_against_reference(got, q_in, k_in, cos, sin, qn, kn, kw, dtype, f"case{i}")
