"""ditfuse.qk_norm_rope against its float64 reference, and its bitwise layout gates."""

import itertools
import zlib

import pytest
import torch
from conftest import DEVICE, DTYPES, assert_close_report, rope_tables

import ditfuse
from ditfuse import NormSpec

NORMS = ["rms", "rms_noaffine", "layer", "dyt", "rms_roundw", None]
SPANS = ["head", "all"]
STYLES = ["interleaved", "half", None]
TABLES = [
    "S,W",
    "1,S,1,W",
    "B,S,W",
    "B,S,1,W",
    "S,H,W",
    "B,S,H,W",
    "unique",
    "pos",
    "pos_b",
    "bf16",
]
FORMS = ["bshd", "bhsd", "flat", "packed", "strided_d"]
HEAD_SHAPES = [(3, 64), (5, 32), (2, 80), (6, 16), (1, 128)]


def make_norm(kind, span, H, D, dtype, g):
    n = D if span == "head" else H * D
    if kind is None:
        return None

    def rnd(*shape, scale=0.5, shift=1.0):
        return (torch.randn(*shape, generator=g) * scale + shift).to(dtype).to(DEVICE)

    if kind == "rms":
        m = torch.nn.RMSNorm(n, eps=1e-6).to(DEVICE, dtype)
        m.weight.data.copy_(rnd(n))
        return m
    if kind == "rms_noaffine":
        return NormSpec("rms", eps=1e-5, size=n)
    if kind == "layer":
        m = torch.nn.LayerNorm(n, eps=1e-6).to(DEVICE, dtype)
        m.weight.data.copy_(rnd(n))
        m.bias.data.copy_(rnd(n, shift=0.0))
        return m
    if kind == "dyt":
        return NormSpec(
            "dyt",
            weight=rnd(n),
            bias=rnd(n, shift=0.0),
            alpha=torch.tensor([0.7], device=DEVICE),
            size=n,
        )
    if kind == "rms_roundw":
        return NormSpec("rms", weight=rnd(n), eps=1e-6, round_before_weight=True)
    raise AssertionError(kind)


def make_qk(form, B, S, H, D, dtype, g):
    """q, k and the kwargs describing them; for 'packed' also the whole buffer."""

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(dtype).to(DEVICE) * 2 + 0.3

    if form == "bshd":
        return randn(B, S, H, D), randn(B, S, H, D), {}, None
    if form == "bhsd":
        return randn(B, H, S, D), randn(B, H, S, D), {"layout": "bhsd"}, None
    if form == "flat":
        return randn(B, S, H * D), randn(B, S, H * D), {"num_heads": H}, None
    if form == "packed":  # one QKV projection output, plus 8 pad channels per token
        buf = randn(B, S, 3 * H * D + 8)
        q = buf[..., : H * D].unflatten(-1, (H, D))
        k = buf[..., H * D : 2 * H * D].unflatten(-1, (H, D))
        return q, k, {}, buf
    if form == "strided_d":  # channel stride 2
        return randn(B, S, H, 2 * D)[..., ::2], randn(B, S, H, 2 * D)[..., ::2], {}, None
    raise AssertionError(form)


def make_tables(kind, B, S, H, R, style, g):
    """cos, sin, extra kwargs, for a rotary width R."""
    if kind == "unique":
        c, s = rope_tables(S, R, style=style, unique=True)
        return c, s, {"rotary_dim": R}
    rows = S + 4 if kind.startswith("pos") else S
    dt = torch.bfloat16 if kind == "bf16" else torch.float32
    c, s = rope_tables(rows, R, dtype=dt, style=style)
    kw = {"rotary_dim": R}
    if kind in ("S,W", "bf16"):
        return c, s, kw
    if kind == "1,S,1,W":
        return c[None, :, None], s[None, :, None], kw
    if kind == "B,S,W":
        noise = torch.randn(B, 1, 1, generator=g).to(DEVICE) * 0.1
        return (c[None] + noise).to(dt), (s[None] - noise).to(dt), kw
    if kind == "B,S,1,W":
        return (
            c[None, :, None].expand(B, S, 1, R).contiguous(),
            s[None, :, None].expand(B, S, 1, R).contiguous(),
            kw,
        )
    if kind == "S,H,W":
        noise = torch.randn(1, H, 1, generator=g).to(DEVICE) * 0.1
        return c[:, None] + noise, s[:, None] - noise, kw
    if kind == "B,S,H,W":
        noise = torch.randn(B, 1, H, 1, generator=g).to(DEVICE) * 0.1
        return c[None, :, None] + noise, s[None, :, None] - noise, kw
    if kind == "pos":
        pos = torch.randperm(rows, generator=g)[:S].to(DEVICE)
        return c, s, dict(kw, positions=pos)
    if kind == "pos_b":
        pos = torch.randint(0, rows, (B, S), generator=g).to(DEVICE)
        return c, s, dict(kw, positions=pos)
    raise AssertionError(kind)


def _cases():
    out = []
    i = 0
    for kind, span, style, dtype in itertools.product(NORMS, SPANS, STYLES, DTYPES):
        if kind is None and span == "all":
            continue
        H, D = HEAD_SHAPES[i % len(HEAD_SHAPES)]
        table = TABLES[i % len(TABLES)]
        form = FORMS[(i // 2) % len(FORMS)]
        partial = style is not None and i % 4 == 1
        inplace = i % 3 == 0
        B = 1 + i % 2
        out.append(
            pytest.param(
                kind,
                span,
                style,
                dtype,
                H,
                D,
                table,
                form,
                partial,
                inplace,
                B,
                id=f"{kind}-{span}-{style}-{str(dtype)[6:]}-{H}x{D}-{table}-{form}"
                f"{'-partial' if partial else ''}{'-inplace' if inplace else ''}-B{B}",
                # the default tier: every norm / span / style in bf16, the other dtypes a
                # third of the time (their shapes, tables and forms rotate with i)
                marks=() if dtype == torch.bfloat16 or i % 3 == 0 else pytest.mark.slow,
            )
        )
        i += 1
    return out


@pytest.mark.parametrize("kind,span,style,dtype,H,D,table,form,partial,inplace,B", _cases())
@torch.no_grad()
def test_against_fp64_reference(
    kind, span, style, dtype, H, D, table, form, partial, inplace, B, poison_outputs
):
    g = torch.Generator().manual_seed(
        zlib.crc32(f"{kind}{span}{style}{dtype}{table}{form}".encode())
    )
    S = 5
    q, k, kw, buf = make_qk(form, B, S, H, D, dtype, g)
    qn = make_norm(kind, span, H, D, dtype, g)
    kn = make_norm(kind, span, H, D, dtype, g)
    cos = sin = None
    if style is not None:
        R = D // 2 if partial else D
        if R % 2:
            R -= 1
        cos, sin, tkw = make_tables(table, B, S, H, R, style, g)
        kw.update(tkw, rope_style=style)
    ref_q, ref_k = ditfuse.qk_norm_rope_reference(
        q, k, cos, sin, q_norm=qn, k_norm=kn, compute_dtype=torch.float64, **kw
    )
    buf_before = buf.clone() if buf is not None else None
    q_in, k_in = q.clone(), k.clone()
    out_q, out_k = ditfuse.qk_norm_rope(q, k, cos, sin, q_norm=qn, k_norm=kn, inplace=inplace, **kw)
    if inplace:
        assert out_q.data_ptr() == q.data_ptr() and out_k.data_ptr() == k.data_ptr()
    else:
        assert torch.equal(q, q_in) and torch.equal(k, k_in), "inputs changed without inplace"
    sq = assert_close_report(out_q, ref_q, dtype, "q")
    sk = assert_close_report(out_k, ref_k, dtype, "k")
    if dtype != torch.float32:  # fp64 reference rounds where the kernel rounds
        assert min(sq, sk) >= 0.97, (sq, sk)
    if buf is not None and inplace:  # V and the pad channels untouched
        HD = H * D
        assert torch.equal(buf[..., 2 * HD :], buf_before[..., 2 * HD :])


@pytest.mark.parametrize("style", ["interleaved", "half"])
@pytest.mark.parametrize("H,D", [(24, 64), (24, 128), (40, 128)])
@torch.no_grad()
def test_bitwise_shared_vs_expanded_table(style, H, D):
    """Shared (S, D) row vs per-head expanded (S, H, D) table: identical bits, and V of a
    packed QKV untouched (the layout gate)."""
    g = torch.Generator().manual_seed(H * 1000 + D)
    B, S, dtype = 1, 3, torch.bfloat16
    buf = (torch.randn(B, S, 3 * H * D, generator=g) * 3).to(dtype).to(DEVICE)
    cos, sin = rope_tables(S, D, style=style)
    cos_e, sin_e = (
        cos[:, None].expand(S, H, D).contiguous(),
        sin[:, None].expand(S, H, D).contiguous(),
    )
    norm = NormSpec(
        "rms", weight=(torch.randn(H * D, generator=g) + 1).to(dtype).to(DEVICE), eps=1e-6
    )
    outs = []
    for c, s in ((cos, sin), (cos_e, sin_e)):
        b = buf.clone()
        q = b[..., : H * D]
        k = b[..., H * D : 2 * H * D]
        ditfuse.qk_norm_rope(
            q, k, c, s, q_norm=norm, k_norm=norm, num_heads=H, rope_style=style, inplace=True
        )
        assert torch.equal(b[..., 2 * H * D :], buf[..., 2 * H * D :]), "V slice changed"
        assert not torch.equal(b[..., : H * D], buf[..., : H * D])
        outs.append(b)
    assert torch.equal(outs[0], outs[1])


@pytest.mark.slow
@pytest.mark.parametrize("style", ["interleaved", "half"])
@torch.no_grad()
def test_bitwise_equivalent_table_forms(style):
    """Every way of passing the same table gives the same bits: 2-D, 4-D broadcast, batch
    broadcast, unique-frequency half width (contiguous or strided views), and rows gathered
    by positions."""
    g = torch.Generator().manual_seed(7)
    B, S, H, D, dtype = 2, 6, 3, 64, torch.float16
    q = torch.randn(B, S, H, D, generator=g).to(dtype).to(DEVICE)
    k = torch.randn(B, S, H, D, generator=g).to(dtype).to(DEVICE)
    cu, su = rope_tables(S + 3, D, style=style, unique=True)
    half = D // 2
    if style == "interleaved":
        cf, sf = cu.repeat_interleave(2, -1), su.repeat_interleave(2, -1)
    else:
        cf, sf = torch.cat((cu, cu), -1), torch.cat((su, su), -1)
    pos = torch.arange(3, S + 3, device=DEVICE)
    norm = torch.nn.RMSNorm(D, eps=1e-6).to(DEVICE, dtype)
    kw = dict(q_norm=norm, k_norm=norm, rope_style=style)
    base = ditfuse.qk_norm_rope(q, k, cf[3:], sf[3:], **kw)
    variants = [
        ditfuse.qk_norm_rope(q, k, cf[None, 3:, None], sf[None, 3:, None], **kw),
        ditfuse.qk_norm_rope(q, k, cf[3:].expand(B, S, D), sf[3:].expand(B, S, D), **kw),
        ditfuse.qk_norm_rope(q, k, cu[3:], su[3:], rotary_dim=D, **kw),
        ditfuse.qk_norm_rope(q, k, cf, sf, positions=pos, **kw),
        ditfuse.qk_norm_rope(q, k, cf, sf, positions=pos[None].expand(B, S), **kw),
        # half width as strided views (a complex table's real / imaginary parts: Qwen-Image)
        # and gathered by positions
        ditfuse.qk_norm_rope(
            q, k, *torch.view_as_real(torch.complex(cu, su))[3:].unbind(-1), rotary_dim=D, **kw
        ),
        ditfuse.qk_norm_rope(q, k, cu, su, rotary_dim=D, positions=pos, **kw),
    ]
    assert half * 2 == D
    for vq, vk in variants:
        assert torch.equal(vq, base[0]) and torch.equal(vk, base[1])


@pytest.mark.parametrize("dtype", DTYPES)
@torch.no_grad()
def test_round_after_norm_false_keeps_fp32(dtype):
    g = torch.Generator().manual_seed(3)
    B, S, H, D = 1, 4, 2, 64
    q = torch.randn(B, S, H, D, generator=g).to(dtype).to(DEVICE)
    cos, sin = rope_tables(S, D)
    norm = NormSpec("rms", eps=1e-6)
    out, _ = ditfuse.qk_norm_rope(q, None, cos, sin, q_norm=norm, round_after_norm=False)
    ref, _ = ditfuse.qk_norm_rope_reference(
        q, None, cos, sin, q_norm=norm, round_after_norm=False, compute_dtype=torch.float64
    )
    share = assert_close_report(out, ref, dtype)
    if dtype != torch.float32:
        assert share >= 0.97
        rounded, _ = ditfuse.qk_norm_rope(q, None, cos, sin, q_norm=norm)
        assert not torch.equal(rounded, out), "the option changed nothing"


@torch.no_grad()
def test_single_token_and_eps_default():
    """S = 1, B > 1, torch.nn.RMSNorm(eps=None) takes finfo(dtype).eps like PyTorch."""
    g = torch.Generator().manual_seed(11)
    B, S, H, D, dtype = 3, 1, 4, 128, torch.bfloat16
    q = torch.randn(B, S, H * D, generator=g).to(dtype).to(DEVICE)
    k = torch.randn(B, S, H * D, generator=g).to(dtype).to(DEVICE)
    norm = torch.nn.RMSNorm(H * D).to(DEVICE, dtype)  # eps=None
    cos, sin = rope_tables(S, D)
    out_q, out_k = ditfuse.qk_norm_rope(
        q, k, cos[None, :, None], sin[None, :, None], q_norm=norm, k_norm=norm, num_heads=H
    )
    ref_q = norm(q).unflatten(2, (H, D)).float()
    x1, x2 = ref_q[..., 0::2], ref_q[..., 1::2]
    c, s = cos[None, :, None, 0::2], sin[None, :, None, 1::2]
    want = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), -1).flatten(-2).to(dtype).flatten(2)
    assert_close_report(out_q, want, dtype)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["wan14b-480p", "flux1-1024", "same-l-decoder"])
@torch.no_grad()
def test_launch_settings_do_not_change_bits(name):
    """The per-token kernel's heads per program and num_warps only split the work: identical
    output here (the interpreter sums in one order). On a GPU the warps also set the order
    of the cross-warp sums of an across-heads norm, so other warps there agree within a
    rounding, not bitwise (H200, 2026-11-29); heads per program never change the bits.
    (Wan's calls take the flat-row kernel, ``test_qk_flat.py``; with ``settings`` given the
    per-token kernel runs, as for the across-heads calls the flat kernel does not take.)"""
    import sys

    from ditfuse.tools.shapes import QK_SHAPES
    from ditfuse.tools.workloads import qk_inputs

    mod = sys.modules["ditfuse.ops.qk_norm_rope"]
    shape = QK_SHAPES[name].small(3)
    inp = qk_inputs(shape, DEVICE, torch.bfloat16)
    p = mod.plan(
        inp["q"],
        inp["k"],
        inp["cos"],
        inp["sin"],
        q_norm=inp["q_norm"],
        k_norm=inp["k_norm"],
        **inp["kwargs"],
    )
    outs = []
    variants = [_table_settings(mod, p), (shape.H, 2), (shape.H, 8)]
    if shape.span != "all":
        variants += [(8, 4), (5, 2)]
    for heads, warps in variants:
        qo, ko = torch.empty_like(p.q), torch.empty_like(p.k)
        mod.launch(p, qo, ko, settings=_settings(mod, p, heads, warps))
        outs.append((qo, ko))
    for qo, ko in outs[1:]:
        assert torch.equal(qo, outs[0][0]) and torch.equal(ko, outs[0][1])


def _settings(mod, p, heads=None, num_warps=None):
    """The per-token kernel's launch settings for plan ``p``: its table's, or these heads
    per program and warps."""
    span_all = bool((p.q_norm and p.q_norm.span_all) or (p.k_norm and p.k_norm.span_all))
    return mod.launch_settings(
        p.q.shape[2],
        p.q.shape[3],
        flat=False,
        has_k=p.k is not None,
        itemsize=p.q.element_size(),
        span_all=span_all,
        heads=heads,
        num_warps=num_warps,
    )


def _table_settings(mod, p):
    """The per-token kernel's own (heads per program, num_warps) for plan ``p``."""
    st = _settings(mod, p)
    return st.heads, st.num_warps


@pytest.mark.parametrize("name", ["wan14b-480p", "flux1-1024"])
@torch.no_grad()
def test_64_bit_token_offsets_same_bits(monkeypatch, name):
    """Offsets within a token are 32-bit unless a head stride makes them reach 2^31; the
    64-bit variant computes the same. ``_needs_off64`` decides by the strides (a (B, H, S, D)
    view at 2^26 tokens x 32 heads x 128 needs it, Wan's packed layout never does)."""
    import sys

    from ditfuse.tools.shapes import QK_SHAPES
    from ditfuse.tools.workloads import qk_inputs

    mod = sys.modules["ditfuse.ops.qk_norm_rope"]
    meta = torch.empty(1, 32, 2**26, 128, device="meta").transpose(1, 2)  # (B, S, H, D) view
    packed = torch.empty(1, 2**26, 3 * 40 * 128, device="meta")[..., :5120].unflatten(-1, (40, 128))
    no_table = (0, 0, 0, 0)
    assert mod._needs_off64(32, 128, [meta], no_table, no_table)
    assert not mod._needs_off64(40, 128, [packed], no_table, no_table)
    shape = QK_SHAPES[name].small(3)
    inp = qk_inputs(shape, DEVICE, torch.bfloat16)
    p = mod.plan(
        inp["q"],
        inp["k"],
        inp["cos"],
        inp["sin"],
        q_norm=inp["q_norm"],
        k_norm=inp["k_norm"],
        **inp["kwargs"],
    )
    # the per-token kernel, with its own table: the flat kernel has no 64-bit variant (a
    # call whose offsets need one is not the flat kernel's, Wan's included)
    st = _settings(mod, p)
    outs = []
    for wide in (False, True):
        monkeypatch.setattr(mod, "_needs_off64", lambda *a, wide=wide: wide)
        qo, ko = torch.full_like(p.q, float("nan")), torch.full_like(p.k, float("nan"))
        mod.launch(p, qo, ko, settings=st)
        outs.append((qo, ko))
    assert not outs[0][0].isnan().any() and not outs[0][1].isnan().any()
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@torch.no_grad()
def test_out_slices_of_a_concatenated_buffer():
    """FLUX's text+image concat: each stream written into its slice of one buffer."""
    g = torch.Generator().manual_seed(21)
    B, T, S, H, D, dtype = 2, 3, 5, 2, 32, torch.bfloat16
    tq, tk, iq, ik = [
        torch.randn(B, n, H, D, generator=g).to(dtype).to(DEVICE) for n in (T, T, S, S)
    ]
    cos, sin = rope_tables(T + S, D)
    n_txt = NormSpec("rms", weight=(torch.randn(D, generator=g) + 1).to(dtype).to(DEVICE), eps=1e-6)
    n_img = NormSpec("rms", weight=(torch.randn(D, generator=g) + 1).to(dtype).to(DEVICE), eps=1e-6)
    qc = torch.full((B, T + S, H, D), float("nan"), dtype=dtype, device=DEVICE)
    kc = torch.full_like(qc, float("nan"))
    ditfuse.qk_norm_rope(
        tq, tk, cos[:T], sin[:T], q_norm=n_txt, k_norm=n_txt, out=(qc[:, :T], kc[:, :T])
    )
    ditfuse.qk_norm_rope(
        iq, ik, cos[T:], sin[T:], q_norm=n_img, k_norm=n_img, out=(qc[:, T:], kc[:, T:])
    )
    wt = ditfuse.qk_norm_rope(tq, tk, cos[:T], sin[:T], q_norm=n_txt, k_norm=n_txt)
    wi = ditfuse.qk_norm_rope(iq, ik, cos[T:], sin[T:], q_norm=n_img, k_norm=n_img)
    assert torch.equal(qc, torch.cat((wt[0], wi[0]), 1)) and torch.equal(
        kc, torch.cat((wt[1], wi[1]), 1)
    )
    with pytest.raises(ValueError, match="out"):
        ditfuse.qk_norm_rope(tq, tk, cos[:T], sin[:T], out=(qc[:, : T + 1], kc[:, :T]))
