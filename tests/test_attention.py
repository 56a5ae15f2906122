"""ditfuse.sliding_window_attention: against an fp64 dense-mask reference, against diffusers'
own SAME code (``_band_mask`` + SDPA, ``SAMEAttnProcessor``), layouts and strided views,
the differential form, the fused QK-norm + RoPE prologue, bad input, the torch.library
boundary, and the sm_90 build (tensor-core instructions, no spills).

Tolerances (written once, below): the error is measured against ``|ref| + lam_scale *
rms(v)`` -- the output is a convex combination of V rows (two, for the differential form),
so rms(v) is its natural scale where the reference itself is near zero.

* bf16 / fp16: the output is rounded once (half an ulp: 2^-9 / 2^-12 of |ref|... up to
  2^-8 / 2^-11 at the bottom of a binade) and the probabilities are rounded to the input
  dtype before P @ V (FlashAttention's choice): ``2^-7`` (bf16) / ``2^-10`` (fp16).
  Measured on the interpreter (which rounds as the GPU does): <= 5.2e-3 / 6.5e-4.
* fp32: tf32 tensor-core operands (10-bit mantissa; emulated under the interpreter by
  truncating the low 13 bits, as the GPU's mma ignores them). For logits of order 1 the
  measured error is <= 1.4e-3 of (|ref| + rms(v)): the bound used is ``2^-8``. The error
  grows with the logit magnitude (the docstring says how).

Most tests run with 16 x 16 tiles (``small_tiles``) so that a few dozen tokens span many
query and key tiles and the band's first/last tile arithmetic is exercised; one test runs
the production launch table.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import ditfuse  # noqa: E402,F401  (after the interpreter is set up)
from ditfuse import sliding_window_attention_reference as reference  # noqa: E402
from ditfuse.norms import NormSpec  # noqa: E402
from ditfuse.ops import attention as A  # noqa: E402
from ditfuse.reference import band_keep  # noqa: E402
from ditfuse.tolerances import ATTENTION, ATTENTION_PROLOGUE_VS_UNFUSED  # noqa: E402
from ditfuse.tools import inspect_attention as AB  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SWA = A.sliding_window_attention
TOL = ATTENTION
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SMALL = (16, 16, 4, 1)  # BLOCK_M, BLOCK_N, num_warps, num_stages


@pytest.fixture
def small_tiles(monkeypatch):
    monkeypatch.setattr(A, "launch_settings", lambda *a, **k: SMALL)


def rnd(g, *shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEVICE)


def check(out, ref, v, dtype, what, lam=0.0):
    """|out - ref| <= TOL * (|ref| + (1 + |lam|) rms(v)); returns the worst ratio."""
    assert out.shape == ref.shape and out.dtype == ref.dtype == dtype, (what, out.shape, ref.shape)
    o, r = out.double(), ref.double()
    assert torch.isfinite(o).all(), f"{what}: non-finite output"
    lam_max = lam.abs().max().item() if isinstance(lam, torch.Tensor) else abs(lam)
    scale = r.abs() + (1 + lam_max) * v.double().pow(2).mean().sqrt()
    ratio = ((o - r).abs() / scale).max().item()
    print(f"\n  {what:40s} err / (|ref| + rms v) = {ratio:.3g}  (tol {TOL[dtype]:.3g})")
    assert ratio <= TOL[dtype], f"{what}: error {ratio:.3g} of (|ref| + rms(v)) > {TOL[dtype]:.3g}"
    return ratio


def qkv(g, B, N, H, D, dtype, n=3):
    return [rnd(g, B, N, H, D, dtype=dtype) for _ in range(n)]


def same_tables(N, R, base=10000.0):
    """cos/sin as SAME builds them: freqs (N, R/2) cat-duplicated to (N, R), fp32."""
    inv = 1.0 / base ** (torch.arange(0, R, 2, dtype=torch.float32) / R)
    freqs = torch.outer(torch.arange(N, dtype=torch.float32), inv)
    freqs = torch.cat((freqs, freqs), -1)
    return freqs.cos().to(DEVICE), freqs.sin().to(DEVICE)


def dyt(g, D, dtype):
    return NormSpec(
        "dyt",
        weight=rnd(g, D, dtype=dtype, scale=0.3) + 1,
        bias=rnd(g, D, dtype=dtype, scale=0.1),
        alpha=torch.tensor([0.7], dtype=dtype, device=DEVICE),
        eps=None,
    )


# ---------------------------------------------------------------------------------------
# the formula: windows, sizes, dtypes

WINDOWS = [0, 1, 17, (3, 0), (0, 5), (7, 2), (-1, 0), (-1, -1), (4, -1), -1]


@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@torch.no_grad()
def test_windows_vs_fp64(window, dtype, small_tiles):
    g = torch.Generator().manual_seed(hash(str(window)) % 1000)
    B, N, H, D = 2, 45, 2, 32  # 45: not a multiple of the tile
    q, k, v = qkv(g, B, N, H, D, dtype)
    out = SWA(q, k, v, window)
    check(out, reference(q, k, v, window, compute_dtype=torch.float64), v, dtype, f"w={window}")


@pytest.mark.parametrize("N", [1, 10, 33], ids=lambda n: f"N{n}")
@torch.no_grad()
def test_sequence_shorter_than_window_and_ragged(N, small_tiles):
    g = torch.Generator().manual_seed(N)
    q, k, v = qkv(g, 2, N, 3, 64, torch.bfloat16)
    out = SWA(q, k, v, 17)
    check(out, reference(q, k, v, 17, compute_dtype=torch.float64), v, torch.bfloat16, f"N={N}")


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16", "fp16"])
@torch.no_grad()
def test_production_launch_table(dtype):
    """The shipped settings (64-query tiles), SAME's window, differential, N = 70."""
    g = torch.Generator().manual_seed(7)
    q, k, v, q2, k2 = qkv(g, 1, 70, 2, 64, dtype, n=5)
    out = SWA(q, k, v, 17, q2=q2, k2=k2)
    ref = reference(q, k, v, 17, q2=q2, k2=k2, compute_dtype=torch.float64)
    check(out, ref, v, dtype, "table", lam=1.0)


@pytest.mark.parametrize("D", [8, 16, 32, 48, 80, 96, 128])
@torch.no_grad()
def test_head_dims(D, small_tiles, monkeypatch):
    """Power-of-two head dims fill the tiles; the others run on padded ones (columns past D
    load 0 and are not stored; a NaN-poisoned output comes back finite: every element written)."""
    monkeypatch.setattr(
        A,
        "_new_out",
        lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device),
    )
    g = torch.Generator().manual_seed(D)
    q, k, v = qkv(g, 1, 24, 2, D, torch.float16)
    out = SWA(q, k, v, (5, 2))
    check(out, reference(q, k, v, (5, 2), compute_dtype=torch.float64), v, torch.float16, f"D={D}")


@pytest.mark.slow
@pytest.mark.parametrize("route", ["fused", "apart"])
@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("D", [48, 96])  # padded to 64 and to 128 (80 pads as 96 does)
@torch.no_grad()
def test_padded_head_dims_differential_prologue(D, norm, route, small_tiles):
    """A head dim that is not a power of two with everything on: differential, a norm whose
    statistics must ignore the padding columns (LayerNorm's mean), partial interleaved RoPE
    and the pass-through channels; the public call (the prologue apart at these shapes) and
    the kernel's fused prologue (explicit 16-row tile settings: ``run`` keeps it fused)
    agree with the fp64 reference."""
    assert A.prologue_apart(D, 4, 9, True, True)
    g = torch.Generator().manual_seed(D + len(norm))
    # 21 tokens: two 16-row tiles, the last ragged (the prologue apart costs a program a token)
    q, k, v, q2, k2 = qkv(g, 2, 21, 3, D, torch.bfloat16, n=5)
    R = D // 2
    cos, sin = same_tables(21, R)
    cos, sin = (t[:, : R // 2].repeat_interleave(2, -1) for t in (cos, sin))
    nspec = (
        NormSpec("layer", eps=1e-5)
        if norm == "layer"
        else NormSpec("rms", weight=rnd(g, D, dtype=torch.bfloat16, scale=0.2) + 1, eps=1e-6)
    )
    kw = dict(
        q2=q2,
        k2=k2,
        lam=0.7,
        q_norm=nspec,
        k_norm=nspec,
        cos=cos,
        sin=sin,
        rope_style="interleaved",
        rotary_dim=R,
    )
    if route == "apart":
        out = SWA(q, k, v, (4, 9), **kw)
    else:
        out = A.run(A.plan(q, k, v, (4, 9), **kw), SMALL)
    check(
        out,
        reference(q, k, v, (4, 9), compute_dtype=torch.float64, **kw),
        v,
        torch.bfloat16,
        f"D={D} {norm} {route}",
        lam=0.7,
    )


@torch.no_grad()
def test_scale(small_tiles):
    g = torch.Generator().manual_seed(3)
    q, k, v = qkv(g, 1, 20, 2, 32, torch.float32)
    out = SWA(q, k, v, 3, scale=0.05)
    check(
        out,
        reference(q, k, v, 3, scale=0.05, compute_dtype=torch.float64),
        v,
        torch.float32,
        "scale",
    )


def test_band_keep_is_sames_band_mask():
    same = pytest.importorskip("diffusers.models.autoencoders.autoencoder_same")
    for n, w in ((1, 0), (9, 0), (40, 17), (12, 30)):
        assert torch.equal(band_keep(n, w, w), same._band_mask(n, w, "cpu", torch.float32) == 0)
    keep = band_keep(6, 2, 0)  # causal with 2 keys of history
    assert keep[5].tolist() == [False, False, False, True, True, True]
    assert band_keep(6, -1, -1).all() and torch.equal(
        band_keep(6, -1, 0), torch.ones(6, 6).tril().bool()
    )


# ---------------------------------------------------------------------------------------
# layouts and views


@torch.no_grad()
def test_packed_projection_views_no_copy(small_tiles):
    """SAME's ``to_qkv(x).chunk(5, -1)`` unflattened to heads: read in place, and bitwise
    the same as contiguous copies (the kernel's result does not depend on the strides)."""
    g = torch.Generator().manual_seed(11)
    B, N, H, D = 2, 37, 2, 64
    buf = rnd(g, B, N, 5 * H * D, dtype=torch.bfloat16)
    q1, q2, k1, k2, v = (t.unflatten(-1, (H, D)) for t in buf.chunk(5, -1))
    assert not q1.is_contiguous() and q1.stride() == (N * 5 * H * D, 5 * H * D, D, 1)
    seen = []
    real = A.launch

    def spy(p, o4, settings=None):
        seen.extend(t.data_ptr() for t in (p.q, p.k, p.v, p.q2, p.k2))
        return real(p, o4, settings)

    A.launch, saved = spy, A.launch
    try:
        out = SWA(q1, k1, v, 17, q2=q2, k2=k2, lam=0.5)
    finally:
        A.launch = saved
    assert seen == [t.data_ptr() for t in (q1, k1, v, q2, k2)]  # views, no copies
    twin = SWA(
        *(t.contiguous() for t in (q1, k1, v)), 17, q2=q2.contiguous(), k2=k2.contiguous(), lam=0.5
    )
    assert out.is_contiguous() and out.shape == (B, N, H, D)
    assert torch.equal(out, twin)
    ref = reference(q1, k1, v, 17, q2=q2, k2=k2, lam=0.5, compute_dtype=torch.float64)
    check(out, ref, v, torch.bfloat16, "packed", lam=0.5)


@torch.no_grad()
def test_bhsd_layout(small_tiles):
    g = torch.Generator().manual_seed(12)
    q, k, v = qkv(g, 2, 29, 3, 32, torch.float32)
    out = SWA(*(t.transpose(1, 2).contiguous() for t in (q, k, v)), (4, 1), layout="bhsd")
    assert out.shape == (2, 3, 29, 32) and out.is_contiguous()
    assert torch.equal(out.transpose(1, 2), SWA(q, k, v, (4, 1)))


@torch.no_grad()
def test_poisoned_output_fully_written(small_tiles, monkeypatch):
    monkeypatch.setattr(
        A,
        "_new_out",
        lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device),
    )
    g = torch.Generator().manual_seed(13)
    for layout, N in (("bshd", 35), ("bhsd", 17)):
        q, k, v, q2, k2 = qkv(g, 2, N, 2, 32, torch.bfloat16, n=5)
        if layout == "bhsd":
            q, k, v, q2, k2 = (t.transpose(1, 2) for t in (q, k, v, q2, k2))
        out = SWA(q, k, v, 3, q2=q2, k2=k2, layout=layout)
        assert torch.isfinite(out.float()).all(), layout


@pytest.mark.parametrize("step", [None, 11], ids=["tile", "step11"])
@torch.no_grad()
def test_visits_only_key_tiles_in_the_band(step, monkeypatch):
    """A NaN in one V row reaches exactly the query tiles whose loop covers its key: BN-key
    tiles from ``lo = max(0, start - left)`` while the tile starts below
    ``min(N, start + S + right)``, S the queries a program stores (BM, or the step). A
    kernel that visits every key tile would poison every row (0 * NaN is NaN in P @ V)."""
    BM = BN = 16
    S = step or BM
    monkeypatch.setattr(A, "launch_settings", lambda *a, **k: (BM, BN, 4, 1, None, None, step))
    g = torch.Generator().manual_seed(14)
    N, left, right, j0 = 96, 3, 5, 50
    q, k, v = qkv(g, 1, N, 1, 32, torch.float32)
    v[0, j0] = float("nan")
    out = SWA(q, k, v, (left, right))
    want = torch.zeros(N, dtype=torch.bool)
    for start in range(0, N, S):
        lo = max(0, start - left)
        hi = min(N, start + S + right)
        end = lo + -(-(hi - lo) // BN) * BN  # the last visited tile's end
        if lo <= j0 < end:
            want[start : start + S] = True
    got = torch.isnan(out[0, :, 0]).any(-1).cpu()
    assert torch.equal(got, want), (
        got.nonzero().flatten().tolist(),
        want.nonzero().flatten().tolist(),
    )
    assert 0 < want.sum() < N


def test_query_step():
    """A program stores fewer queries than its tile where their band spans one key tile
    fewer and that saves >= 10% of the key slots a query; the band's keys fit the tiles."""
    qs = A.query_step
    assert qs(64, 32, 17, 17) == 62 and qs(16, 16, 17, 17) == 14 and qs(32, 16, 17, 17) == 30
    assert qs(64, 32, 0, 0) == 64  # 64 keys in 2 tiles already: nothing to save
    assert qs(64, 32, 17, 0) == 64  # 47 queries in 2 tiles: 9% fewer slots, kept
    assert qs(64, 32, -1, 0) == qs(64, 32, 3, -1) == 64  # unbounded sides
    assert qs(64, 64, 17, 17) == 64  # 30 queries would be under half the tile
    for bm, bn in ((16, 16), (32, 16), (64, 16), (64, 32), (64, 64)):
        for left in range(0, 40, 3):
            for right in range(0, 40, 5):
                s = qs(bm, bn, left, right)
                trips = -(-(bm + left + right) // bn)
                assert 1 <= s <= bm
                if s < bm:
                    assert -(-(s + left + right) // bn) == trips - 1 and s >= bm // 2
    st = A.launch_settings(64, torch.bfloat16, 17, 17, 8704, True, False)
    assert (
        st.step_m == 62
        and A.launch_settings(64, torch.bfloat16, -1, 0, 8704, False, False).step_m is None
    )


@pytest.mark.slow
@pytest.mark.parametrize("step", [1, 5, 13, 16])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@torch.no_grad()
def test_any_query_step_gives_the_formula(step, layout, monkeypatch):
    """Whatever the step (queries a program stores of its 16), the output is the formula's
    and every element is written: NaN-poisoned output, batch 2, a ragged last program,
    differential with a per-head lambda, both grid orders."""
    monkeypatch.setattr(A, "launch_settings", lambda *a, **k: (16, 16, 4, 1, None, None, step))
    monkeypatch.setattr(
        A,
        "_new_out",
        lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device),
    )
    g = torch.Generator().manual_seed(30 + step)
    B, N, H, D = 2, 45, 3, 32
    q, k, v, q2, k2 = qkv(g, B, N, H, D, torch.float32, n=5)
    lam = torch.tensor([0.3, -0.7, 1.1], device=DEVICE)
    ref = reference(q, k, v, (6, 3), q2=q2, k2=k2, lam=lam, compute_dtype=torch.float64)
    if layout == "bhsd":
        q, k, v, q2, k2 = (t.transpose(1, 2) for t in (q, k, v, q2, k2))
    out = SWA(q, k, v, (6, 3), q2=q2, k2=k2, lam=lam, layout=layout)
    if layout == "bhsd":
        out = out.transpose(1, 2)
    check(
        out,
        ref,
        v if layout == "bshd" else v.transpose(1, 2),
        torch.float32,
        f"step {step} {layout}",
        lam=lam,
    )


def test_bad_query_step_is_refused():
    g = torch.Generator().manual_seed(3)
    q, k, v = qkv(g, 1, 20, 1, 32, torch.float32)
    p = A.plan(q, k, v, 3)
    for bad in (0, 17):
        with pytest.raises(ValueError, match="step_m must be in 1 .. block_m = 16"):
            A.run(p, (16, 16, 4, 1, None, None, bad))


@torch.no_grad()
def test_mma_sync_option_same_bits_and_environment_restored(monkeypatch):
    """``mma_sync`` (the 8th launch setting) only changes how Triton lowers the dots: on the
    interpreter the same bits; the process's environment is as before the call."""
    import os

    g = torch.Generator().manual_seed(31)
    q, k, v, q2, k2 = qkv(g, 1, 40, 2, 32, torch.float32, n=5)
    p = A.plan(q, k, v, 5, q2=q2, k2=k2)
    before = os.environ.get("DISABLE_MMA_V3")
    want = A.run(p, (16, 16, 4, 1, None, None, 14))
    got = A.run(p, (16, 16, 4, 1, None, None, 14, True))
    assert torch.equal(got, want)
    assert os.environ.get("DISABLE_MMA_V3") == before


@pytest.mark.slow
@torch.no_grad()
@pytest.mark.parametrize("D", [64, 48, 32])  # 48: a padded head dim
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("diff", [True, False], ids=["diff", "plain"])
def test_split_pv_same_bits(D, dtype, diff, exact_interpreter_dots):
    """``split_pv`` (the 9th launch setting: P @ V and the output store as two halves of the
    tile's columns) computes every output column with the same products and sums: on the
    interpreter (op-by-op arithmetic, each dot's sums in fp64: ``exact_interpreter_dots``)
    the same bits as the one-dot tile, padded head dims (48 -> 64, 80 -> 128: the masked
    columns in the upper half) and a ragged last query tile included. On the GPU the one-dot
    2-warp tile is lowered with its columns split across the warps and differs in the last
    bits (seen on the H200, 2026-12-02): there both are held to the fp64 contract."""
    g = torch.Generator().manual_seed(40 + D)
    n = 5 if diff else 3
    t = qkv(g, 2, 45, 3, D, dtype, n=n)
    q, k, v = t[:3]
    q2, k2 = (t[3], t[4]) if diff else (None, None)
    lam = 0.7 if diff else 1.0
    p = A.plan(q, k, v, 6, q2=q2, k2=k2, lam=lam)
    want = A.run(p, (32, 16, 2, 2, True, None, 30, False, False))
    got = A.run(p, (32, 16, 2, 2, True, None, 30, False, True))
    if DEVICE == "cpu":
        assert torch.equal(got, want)
    ref = reference(q, k, v, 6, q2=q2, k2=k2, lam=lam, compute_dtype=torch.float64)
    for out, what in ((got, "split"), (want, "one dot")):
        check(out, ref, v, dtype, f"split_pv D={D} {what}", lam=lam if diff else 0.0)


@torch.no_grad()
def test_split_pv_with_the_fused_prologue_same_bits(exact_interpreter_dots):
    """The split only touches P @ V and the store: with a norm and partial RoPE fused into
    the Q / K tiles the same bits as the one-dot tile on the interpreter (on the GPU: see
    test_split_pv_same_bits), and within the fp64 contract of the prologue's reference."""
    g = torch.Generator().manual_seed(47)
    B, N, H, D = 1, 40, 2, 64
    q, k, v, q2, k2 = qkv(g, B, N, H, D, torch.bfloat16, n=5)
    w = rnd(g, D, dtype=torch.bfloat16, scale=0.2) + 1
    cos, sin = same_tables(N, 32)
    kw = dict(
        q_norm=NormSpec("rms", weight=w, eps=1e-6),
        k_norm=NormSpec("rms", weight=w, eps=1e-6),
        cos=cos,
        sin=sin,
        rotary_dim=32,
    )
    p = A.plan(q, k, v, 5, q2=q2, k2=k2, **kw)
    want = A.run(p, (32, 16, 2, 2, True, None, 30, False, False))
    got = A.run(p, (32, 16, 2, 2, True, None, 30, False, True))
    if DEVICE == "cpu":
        assert torch.equal(got, want)
    ref = reference(q, k, v, 5, q2=q2, k2=k2, compute_dtype=torch.float64, **kw)
    check(got, ref, v, torch.bfloat16, "split_pv + prologue", lam=1.0)


def test_split_pv_refused_below_32_columns():
    g = torch.Generator().manual_seed(48)
    q, k, v = qkv(g, 1, 20, 1, 16, torch.float32)
    p = A.plan(q, k, v, 3)
    with pytest.raises(ValueError, match="split_pv needs a tile of >= 32 columns"):
        A.run(p, (16, 16, 1, 1, None, None, None, False, True))


@torch.no_grad()
def test_int64_in_tile_offsets_same_result(small_tiles, monkeypatch):
    """The OFF64 build (in-tile offsets in int64, for strides past 2^31 / BLOCK) computes
    the same bits as the int32 build."""
    g = torch.Generator().manual_seed(16)
    q, k, v, q2, k2 = qkv(g, 1, 21, 2, 32, torch.bfloat16, n=5)
    want = SWA(q, k, v, 4, q2=q2, k2=k2)
    monkeypatch.setattr(A, "_fits_int32", lambda *a: False)
    assert torch.equal(SWA(q, k, v, 4, q2=q2, k2=k2), want)


@torch.no_grad()
def test_reference_fallback_where_triton_cannot_run(monkeypatch):
    """On a device the kernel cannot run on, the fp32 reference computes the output."""
    from ditfuse.runtime import backend as _runtime

    monkeypatch.setattr(_runtime, "kernel_device_ok", lambda t: False)
    g = torch.Generator().manual_seed(17)
    q, k, v, q2, k2 = qkv(g, 1, 19, 2, 32, torch.float32, n=5)
    out = SWA(q, k, v, (2, 5), q2=q2, k2=k2, lam=0.3)
    ref = reference(q, k, v, (2, 5), q2=q2, k2=k2, lam=0.3, compute_dtype=torch.float64)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------
# differential


@pytest.mark.parametrize("lam", ["float", "per-head", "one-element"])
@torch.no_grad()
def test_differential_lambda(lam, small_tiles):
    g = torch.Generator().manual_seed(15)
    B, N, H, D = 2, 30, 3, 32
    q, k, v, q2, k2 = qkv(g, B, N, H, D, torch.float32, n=5)
    lam_v = {
        "float": 0.8,
        "per-head": torch.tensor([0.2, -0.5, 1.3], dtype=torch.bfloat16, device=DEVICE),
        "one-element": torch.tensor([0.6], device=DEVICE),
    }[lam]
    out = SWA(q, k, v, 5, q2=q2, k2=k2, lam=lam_v)
    ref = reference(q, k, v, 5, q2=q2, k2=k2, lam=lam_v, compute_dtype=torch.float64)
    check(out, ref, v, torch.float32, f"lam {lam}", lam=lam_v)
    # the formula itself: Attn(q, k, v) - lam * Attn(q2, k2, v)
    a1 = reference(q, k, v, 5, compute_dtype=torch.float64).double()
    a2 = reference(q2, k2, v, 5, compute_dtype=torch.float64).double()
    lam_b = lam_v if not isinstance(lam_v, torch.Tensor) else lam_v.double().reshape(-1, 1)
    torch.testing.assert_close(ref.double(), a1 - lam_b * a2, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------
# the fused prologue

PROLOGUES = {
    # SAME: DyT per head, rotate-half RoPE over the first 32 of 64 channels
    "dyt-half-r32": dict(norm="dyt", rope_style="half", R=32, table="full"),
    "rms-interleaved-full": dict(norm="rms", rope_style="interleaved", R=64, table="full"),
    # R/2 = 8 and D - R = 48 pad to 16 and 64 channels: the padding must stay zero in the
    # dots although a LayerNorm without affine maps a zero to -mean * rstd
    "layer-plain-interleaved-r16": dict(
        norm="layer-plain", rope_style="interleaved", R=16, table="full"
    ),
    "layer-half-unique": dict(norm="layer", rope_style="half", R=64, table="unique"),
    "norm-only": dict(norm="rms", rope_style="half", R=0, table=None),
    "rope-only": dict(norm=None, rope_style="half", R=32, table="full"),
}


def _prologue_kwargs(g, name, N, D, dtype):
    cfg = PROLOGUES[name]
    kw = {}
    for side in ("q_norm", "k_norm"):
        if cfg["norm"] == "dyt":
            kw[side] = dyt(g, D, dtype)
        elif cfg["norm"] == "rms":
            kw[side] = NormSpec("rms", weight=rnd(g, D, dtype=dtype, scale=0.2) + 1, eps=1e-6)
        elif cfg["norm"] == "layer-plain":
            kw[side] = NormSpec("layer", eps=1e-5)
        elif cfg["norm"] == "layer":
            kw[side] = NormSpec(
                "layer",
                weight=rnd(g, D, dtype=dtype, scale=0.2) + 1,
                bias=rnd(g, D, dtype=dtype, scale=0.1),
                eps=1e-5,
            )
    R = cfg["R"]
    if R:
        cos, sin = same_tables(N, R)
        if cfg["rope_style"] == "interleaved":
            cos, sin = (t[:, : R // 2].repeat_interleave(2, -1) for t in (cos, sin))
        if cfg["table"] == "unique":
            cos, sin = cos[:, : R // 2], sin[:, : R // 2]
        kw.update(cos=cos, sin=sin, rope_style=cfg["rope_style"], rotary_dim=R)
    return kw


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PROLOGUES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@torch.no_grad()
def test_prologue_vs_fp64_and_vs_qk_norm_rope(name, dtype, small_tiles):
    """Fused prologue == the fp64 reference (whose prologue is qk_norm_rope's reference,
    rounded where the kernel rounds), and within one rounding of ``qk_norm_rope`` followed
    by the kernel without prologue (the score dot is split per channel group, so fp32
    accumulation order differs)."""
    g = torch.Generator().manual_seed(len(name))
    B, N, H, D = 1, 22, 2, 64
    q, k, v, q2, k2 = qkv(g, B, N, H, D, dtype, n=5)
    kw = _prologue_kwargs(g, name, N, D, dtype)
    out = SWA(q, k, v, 6, q2=q2, k2=k2, **kw)
    ref = reference(q, k, v, 6, q2=q2, k2=k2, compute_dtype=torch.float64, **kw)
    check(out, ref, v, dtype, name, lam=1.0)
    qkw = dict(
        q_norm=kw.get("q_norm"),
        k_norm=kw.get("k_norm"),
        rope_style=kw.get("rope_style", "half"),
        rotary_dim=kw.get("rotary_dim"),
    )
    qa, ka = ditfuse.qk_norm_rope(q, k, kw.get("cos"), kw.get("sin"), **qkw)
    qb, kb = ditfuse.qk_norm_rope(q2, k2, kw.get("cos"), kw.get("sin"), **qkw)
    unfused = SWA(qa, ka, v, 6, q2=qb, k2=kb)
    if dtype == torch.float32 and PROLOGUES[name]["norm"] in ("rms", "layer", "layer-plain"):
        # a last-bit difference in a row's statistic can move a tf32-truncated operand by a
        # tf32 ulp: the tf32 bound, not one fp32 rounding
        check(out, unfused, v, dtype, f"{name} vs qk_norm_rope", lam=1.0)
        return
    tol = ATTENTION_PROLOGUE_VS_UNFUSED[dtype]
    scale = 2 * v.float().pow(2).mean().sqrt().item()
    torch.testing.assert_close(out.float(), unfused.float(), rtol=tol, atol=tol * scale)
    assert (out == unfused).float().mean() > (0.9 if dtype == torch.bfloat16 else 0.0)


# ---------------------------------------------------------------------------------------
# against diffusers' SAME code


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@torch.no_grad()
def test_vs_band_mask_sdpa(dtype, small_tiles):
    """Plain attention == SDPA with SAME's dense ``_band_mask`` (diffusers' eager code)."""
    same = pytest.importorskip("diffusers.models.autoencoders.autoencoder_same")
    g = torch.Generator().manual_seed(21)
    B, N, H, D, w = 2, 40, 2, 64, 17
    q, k, v = qkv(g, B, N, H, D, dtype)
    mask = same._band_mask(N, w, q.device, dtype)
    eager = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask
    ).transpose(1, 2)
    # eager rounds the probabilities no differently than the kernel: same tolerance
    check(SWA(q, k, v, w), eager, v, dtype, "band mask sdpa")


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.slow)],
    ids=["fp32", "bf16"],
)
@torch.no_grad()
def test_vs_same_attn_processor(dtype, small_tiles):
    """The whole SAMEAttention (differential, DynamicTanh q/k norm, partial rotate-half
    RoPE, band mask) run by diffusers' own processor, against one fused call on the views
    of its ``to_qkv`` output. ``to_out`` is set to the identity so the attention output is
    compared directly.

    Tolerance vs eager: in bf16 the eager DyT rounds after each of its steps (alpha * x,
    tanh, * gamma, + beta) where ditfuse rounds once, and eager rounds each attention map
    before the difference: four roundings (4 * 2^-7) of (|ref| + 2 rms(v)). fp32: the tf32
    bound.
    """
    same = pytest.importorskip("diffusers.models.autoencoders.autoencoder_same")
    g = torch.Generator().manual_seed(22)
    B, N, H, D, w = 2, 36, 2, 64, 17
    attn = same.SAMEAttention(H * D, dim_heads=D, use_differential=True)
    with torch.no_grad():
        attn.to_qkv.weight.copy_(
            torch.randn(attn.to_qkv.weight.shape, generator=g) / math.sqrt(H * D)
        )
        attn.to_out.weight.copy_(torch.eye(H * D))
        for norm in (attn.q_norm, attn.k_norm):
            norm.alpha.fill_(0.9)
            norm.gamma.copy_(1 + 0.3 * torch.randn(D, generator=g))
            norm.beta.copy_(0.1 * torch.randn(D, generator=g))
    attn = attn.to(DEVICE, dtype)
    x = rnd(g, B, N, H * D, dtype=dtype)
    eager = attn(x, attn_mask=same._band_mask(N, w, x.device, dtype)).unflatten(-1, (H, D))

    q1, q2, k1, k2, v = (t.unflatten(-1, (H, D)) for t in attn.to_qkv(x).chunk(5, dim=-1))
    freqs = attn.rope(N, x.device).float()
    out = SWA(
        q1,
        k1,
        v,
        w,
        q2=q2,
        k2=k2,
        q_norm=attn.q_norm,
        k_norm=attn.k_norm,
        cos=freqs.cos(),
        sin=freqs.sin(),
        rotary_dim=freqs.shape[-1],
    )
    assert out.shape == eager.shape and out.dtype == dtype
    ref = reference(
        q1,
        k1,
        v,
        w,
        q2=q2,
        k2=k2,
        q_norm=attn.q_norm,
        k_norm=attn.k_norm,
        cos=freqs.cos(),
        sin=freqs.sin(),
        rotary_dim=freqs.shape[-1],
        compute_dtype=torch.float64,
    )
    check(out, ref, v, dtype, "SAME vs fp64", lam=1.0)
    o, e = out.double(), eager.double()
    tol = 4 * TOL[dtype] if dtype != torch.float32 else TOL[dtype]
    ratio = ((o - e).abs() / (e.abs() + 2 * v.double().pow(2).mean().sqrt())).max().item()
    print(f"\n  SAMEAttnProcessor (eager) vs fused: {ratio:.3g}  (tol {tol:.3g})")
    assert ratio <= tol, f"SAMEAttnProcessor: {ratio:.3g} > {tol:.3g}"


# ---------------------------------------------------------------------------------------
# bad input: an error naming the argument, before any kernel runs


def _bad_cases():
    g = torch.Generator().manual_seed(0)
    q, k, v, q2, k2 = qkv(g, 2, 8, 2, 64, torch.bfloat16, n=5)
    cos, sin = same_tables(8, 32)
    return [
        ("window -2", (q, k, v, -2), {}, ValueError, "window left = -2"),
        ("window right -5", (q, k, v, (3, -5)), {}, ValueError, "window right = -5"),
        ("window float", (q, k, v, 2.5), {}, TypeError, "window left"),
        ("window triple", (q, k, v, (1, 2, 3)), {}, ValueError, "(left, right)"),
        ("window bool", (q, k, v, True), {}, TypeError, "window"),
        ("q2 without k2", (q, k, v, 3), dict(q2=q2), ValueError, "q2 given without k2"),
        ("k2 without q2", (q, k, v, 3), dict(k2=k2), ValueError, "k2 given without q2"),
        ("lam without q2", (q, k, v, 3), dict(lam=0.5), ValueError, "lam"),
        ("lam shape", (q, k, v, 3), dict(q2=q2, k2=k2, lam=torch.ones(3)), ValueError, "lam"),
        (
            "lam int tensor",
            (q, k, v, 3),
            dict(q2=q2, k2=k2, lam=torch.ones(2, dtype=torch.long)),
            TypeError,
            "lam.dtype",
        ),
        ("head_dim mismatch k", (q, k[..., :32], v, 3), {}, ValueError, "head_dim mismatch: k"),
        ("head_dim mismatch v", (q, k, v[..., :32], 3), {}, ValueError, "head_dim mismatch: v"),
        (
            "head_dim 160",
            (
                q[..., :40].repeat(1, 1, 1, 4),
                k[..., :40].repeat(1, 1, 1, 4),
                v[..., :40].repeat(1, 1, 1, 4),
                3,
            ),
            {},
            ValueError,
            "head_dim must be between 1 and 128, got 160",
        ),
        ("dtype k", (q, k.float(), v, 3), {}, TypeError, "k.dtype"),
        ("dtype q2", (q, k, v, 3), dict(q2=q2.half(), k2=k2), TypeError, "q2.dtype"),
        ("int q", (q.to(torch.int32), k, v, 3), {}, TypeError, "q.dtype"),
        ("device v", (q, k, v.to("meta"), 3), {}, ValueError, "v is on"),
        ("3-D q", (q.flatten(2), k, v, 3), {}, ValueError, "q must be 4-D"),
        ("tokens differ", (q, k[:, :7], v[:, :7], 3), {}, ValueError, "k.shape"),
        ("layout", (q, k, v, 3), dict(layout="sbhd"), ValueError, "layout"),
        ("rope_style", (q, k, v, 3), dict(rope_style="neox"), ValueError, "rope_style"),
        ("scale", (q, k, v, 3), dict(scale=-1.0), ValueError, "scale"),
        (
            "norm across heads",
            (q, k, v, 3),
            dict(q_norm=NormSpec("rms", weight=torch.ones(2 * 64, device=DEVICE))),
            ValueError,
            "across all 2 heads",
        ),
        ("cos without sin", (q, k, v, 3), dict(cos=cos), ValueError, "both cos and sin"),
        (
            "cos rows",
            (q, k, v, 3),
            dict(cos=cos[:5], sin=sin[:5], rotary_dim=32),
            ValueError,
            "cos",
        ),
        ("cos D/2 ambiguous", (q, k, v, 3), dict(cos=cos, sin=sin), ValueError, "rotary_dim"),
        ("norm module", (q, k, v, 3), dict(k_norm=torch.nn.GroupNorm(1, 64)), TypeError, "k_norm"),
    ]


@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_input_raises_before_launch(case, monkeypatch):
    name, args, kw, exc, text = case

    def no_launch(*a, **k):
        raise AssertionError("a kernel was launched")

    monkeypatch.setattr(A, "launch", no_launch)
    monkeypatch.setattr(A, "_new_out", no_launch)
    with torch.no_grad(), pytest.raises(exc) as ei:
        SWA(*args, **kw)
    assert text in str(ei.value), f"{name}: {ei.value}"


def test_inference_only():
    g = torch.Generator().manual_seed(0)
    q, k, v = qkv(g, 1, 4, 1, 32, torch.float32)
    with pytest.raises(RuntimeError, match="inference-only"):
        SWA(q.requires_grad_(), k, v, 1)


@torch.no_grad()
def test_empty():
    q = torch.empty(2, 0, 3, 64, device=DEVICE)
    assert SWA(q, q, q, 4).shape == (2, 0, 3, 64)


# ---------------------------------------------------------------------------------------
# torch.library boundary


@torch.no_grad()
def test_opcheck(small_tiles):
    g = torch.Generator().manual_seed(31)
    q, k, v, q2, k2 = qkv(g, 1, 12, 2, 64, torch.bfloat16, n=5)
    cos, sin = same_tables(12, 32)
    norm = dyt(g, 64, torch.bfloat16)
    torch.library.opcheck(
        torch.ops.ditfuse.sliding_window_attention.default, A.op_args(q, k, v, (2, 3))
    )
    lam = torch.tensor([0.5, 1.5], device=DEVICE)
    torch.library.opcheck(
        torch.ops.ditfuse.sliding_window_attention.default,
        A.op_args(
            q,
            k,
            v,
            3,
            q2=q2,
            k2=k2,
            lam=lam,
            q_norm=norm,
            k_norm=norm,
            cos=cos,
            sin=sin,
            rotary_dim=32,
        ),
    )


@torch.no_grad()
def test_compile_fullgraph_matches_eager(small_tiles):
    g = torch.Generator().manual_seed(32)
    B, N, H, D = 1, 12, 2, 64
    buf = rnd(g, B, N, 5 * H * D, dtype=torch.bfloat16)
    cos, sin = same_tables(N, 32)
    norm = dyt(g, D, torch.bfloat16)
    torch._dynamo.reset()

    def f(buf):
        q1, q2, k1, k2, v = (t.unflatten(-1, (H, D)) for t in buf.chunk(5, -1))
        out = SWA(
            q1, k1, v, 3, q2=q2, k2=k2, q_norm=norm, k_norm=norm, cos=cos, sin=sin, rotary_dim=32
        )
        return out.flatten(2) * 2

    want = f(buf)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(buf)
    assert torch.equal(got, want)


# ---------------------------------------------------------------------------------------
# sm_90 build on the CPU: tensor cores, no spills


def _missing_tools():
    from ditfuse.aot.compile import missing_tools

    return missing_tools()


@pytest.mark.slow
@pytest.mark.skipif(bool(_missing_tools()), reason="the Triton wheel has no ptxas/cuobjdump")
def test_sm90_build_uses_tensor_cores_without_local_memory_in_loops(tmp_path):
    """SAME-L (bf16 and fp32, differential + DyT/RoPE prologue; fp32 without it, the
    one-warp entries, differential, plain and the TensorRT contract) and the heaviest table
    entry (head_dim 128, fp32, differential + prologue), compiled for sm_90a in a
    ``TRITON_INTERPRET=0`` subprocess exactly as a call builds them: the PTX holds
    wgmma/mma instructions, no local memory inside a loop (``local_in_loops``), at most
    ``LOCAL_BYTES_MAX`` bytes of it outside."""
    names = [
        "same-l-bf16",
        "same-l-fp32",
        "d128-fp32-diff-prologue",
        "same-l-fp32-attn",
        "same-l-trt-fp32",
        "same-l-fp32-plain",
        "same-l-fp32-attn-highest",
        "same-l-fp32-plain-highest",
    ]
    src = Path(A.__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="0")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(src)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    out = tmp_path / "rows.json"
    code = (
        "import json; from ditfuse.tools.inspect_attention import build_report; "
        f"json.dump(build_report({names!r}), open({str(out)!r}, 'w'))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0 and out.exists(), (r.stdout + r.stderr)[-6000:]
    rows = {row["name"]: row for row in json.loads(out.read_text())}
    assert sorted(rows) == sorted(names)
    for name, row in rows.items():
        detail = f"{name}: {row}"
        assert row["wgmma"] + row["mma"] > 0, detail
        # local memory: none inside a loop, a few bytes outside (the one-warp fp32 entry
        # keeps one value across its key loop)
        assert row["loop_local"] == 0 and not row["violations"], detail
        assert max(row["spill_stores"], row["spill_loads"], row["stack"]) <= AB.LOCAL_BYTES_MAX, (
            detail
        )
        assert 0 < row["regs"] <= 255 and row["smem"] <= 227 * 1024, detail
        want = A.launch_settings(
            row["D"],
            getattr(
                torch, {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}[row["dtype"]]
            ),
            17,
            17,
            row["N"],
            row["differential"],
            row["prologue"],
            A.dot_precision(
                getattr(
                    torch, {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}[row["dtype"]]
                ),
                row["precision"],
            ),
        )
        assert (row["block_m"], row["block_n"], row["num_warps"], row["num_stages"]) == (
            want.block_m,
            want.block_n,
            want.num_warps,
            want.num_stages,
        ), detail
        assert row["maxnreg"] == want.maxnreg and row["step_m"] == want.step_m, detail
        assert row["enable_fp_fusion"] is False, detail  # no contraction: see launch()


@pytest.mark.slow
@pytest.mark.skipif(bool(_missing_tools()), reason="the Triton wheel has no ptxas/cuobjdump")
def test_sm90_build_mma_sync_option(tmp_path):
    """A 64-query fp32 tile on 4 warps builds to wgmma; with ``mma_sync`` to mma.sync (each
    warp 16 query rows), no wgmma, within the build gate's resources."""
    src = Path(A.__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path / "cache"))
    env.pop("DISABLE_MMA_V3", None)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(src)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    out = tmp_path / "rows.json"
    code = (
        "import json, os; from ditfuse.ops import attention as A; "
        "from ditfuse.tools import inspect_attention as AB\n"
        "spec = next(s for s in AB.BUILD_SPECS if s.name == 'same-l-fp32-attn')\n"
        "rows = []\n"
        "for mma in (False, True):\n"
        "    A.launch_settings = lambda *a, mma=mma, **k: "
        "A.Settings(64, 16, 4, 3, True, None, 62, mma)\n"
        "    rows.append(AB.build(spec))\n"
        "    assert 'DISABLE_MMA_V3' not in os.environ\n"
        f"json.dump(rows, open({str(out)!r}, 'w'))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0 and out.exists(), (r.stdout + r.stderr)[-6000:]
    wg, ms = json.loads(out.read_text())
    assert wg["wgmma"] > 0 and wg["mma"] == 0, wg
    assert ms["wgmma"] == 0 and ms["mma"] > 0, ms
    assert ms["loop_local"] == 0 and not ms["violations"] and ms["regs"] <= 255, ms


@pytest.mark.slow
@torch.no_grad()
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_grid_order_does_not_change_bits(layout):
    """The grid order (query tile outer for bshd, head outer for bhsd) only changes which
    program computes a tile, never the tile's arithmetic: both orders, both layouts, batch 2
    and a ragged last tile give the same bits."""
    g = torch.Generator().manual_seed(21)
    B, N, H, D = 2, 37, 3, 32
    q, k, v, q2, k2 = qkv(g, B, N, H, D, torch.bfloat16, n=5)
    if layout == "bhsd":
        q, k, v, q2, k2 = (
            t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, q2, k2)
        )
    p = A.plan(q, k, v, 5, q2=q2, k2=k2)
    outs = [A.run(p, (16, 16, 4, 1, tm)) for tm in (True, False)]
    assert torch.equal(outs[0], outs[1])
    ref = A.run(p, (16, 16, 4, 1))  # the default order for this layout
    assert torch.equal(ref, outs[0])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@torch.no_grad()
def test_d128_differential_prologue_runs_apart(dtype, monkeypatch):
    """head_dim 128, differential, a norm and a partial rotary width, the production launch
    table: the case whose fused sm_90 build gave wrong results on the H200 (2026-11-30)
    runs the prologue apart (qk_norm_rope, then the attention without one), within the
    contract of the fp64 reference; head_dim 128 without the differential form and SAME's
    head_dim 64 keep their routes."""
    assert A.prologue_apart(128, 3, 3, True, True)
    assert not A.prologue_apart(128, 3, 3, False, True)
    assert not A.prologue_apart(128, 3, 3, True, False)
    assert A.prologue_apart(64, 17, 17, True, True) and not A.prologue_apart(64, 40, 40, True, True)
    g = torch.Generator().manual_seed(52)
    # one batch entry (the prologue apart costs a program a token); 70 tokens: two query tiles
    B, N, H, D, R = 1, 70, 2, 128, 64
    q, k, v, q2, k2 = (t.transpose(1, 2) for t in qkv(g, B, N, H, D, dtype, n=5))
    cos, sin = same_tables(N, R)
    cos, sin = (t[:, : R // 2].repeat_interleave(2, -1) for t in (cos, sin))
    kw = dict(
        q2=q2,
        k2=k2,
        lam=0.8,
        layout="bhsd",
        q_norm=NormSpec("layer", eps=1e-5),
        k_norm=NormSpec("layer", eps=1e-5),
        cos=cos,
        sin=sin,
        rope_style="interleaved",
        rotary_dim=R,
    )
    launched = []
    real = A._apart
    monkeypatch.setattr(A, "_apart", lambda *a, **k: launched.append(1) or real(*a, **k))
    out = SWA(q, k, v, 3, **kw)
    assert launched, "the prologue did not run apart"
    check(
        out,
        reference(q, k, v, 3, compute_dtype=torch.float64, **kw),
        v,
        dtype,
        "d128 apart",
        lam=0.8,
    )


@pytest.mark.slow
@pytest.mark.parametrize("packed", [True, False], ids=["packed", "separate"])
@torch.no_grad()
def test_differential_prologue_apart_in_one_pass(packed, monkeypatch):
    """SAME's own call (differential, DyT + rotate-half RoPE over half the channels, the
    chunks of a packed [q1 | q2 | k1 | k2 | v] projection, the prologue apart): Q2's heads
    follow Q1's in memory, so the prologue runs as one qk_norm_rope pass over both
    (``_joint_plan``); separate tensors take two passes. Either way the fp64 reference's
    contract holds, and under the interpreter the one pass gives the two passes' bits of
    contiguous copies (per head, the same arithmetic)."""
    import importlib

    from ditfuse.runtime import fastpath as _fastpath

    qkr = importlib.import_module("ditfuse.ops.qk_norm_rope")
    monkeypatch.setattr(_fastpath, "ENABLED", False)
    g = torch.Generator().manual_seed(17)
    B, N, H, D, R = 2, 21, 3, 64, 32  # 21 tokens: the prologue apart costs a program a token
    if packed:
        buf = rnd(g, B, N, 5 * H * D, dtype=torch.bfloat16)
        q, q2, k, k2, v = (t.unflatten(-1, (H, D)) for t in buf.chunk(5, -1))
    else:
        q, k, v, q2, k2 = qkv(g, B, N, H, D, torch.bfloat16, n=5)
    cos, sin = same_tables(N, R)
    kw = dict(
        q2=q2,
        k2=k2,
        lam=0.6,
        q_norm=dyt(g, D, torch.bfloat16),
        k_norm=dyt(g, D, torch.bfloat16),
        cos=cos,
        sin=sin,
        rotary_dim=R,
    )
    assert A.prologue_apart(D, 17, 17, True, True)
    heads = []
    real = qkr.launch
    monkeypatch.setattr(
        qkr, "launch", lambda p, *a, **k: heads.append(p.q.shape[2]) or real(p, *a, **k)
    )
    out = SWA(q, k, v, 17, **kw)
    assert heads == ([2 * H] if packed else [H, H]), heads
    check(
        out,
        reference(q, k, v, 17, compute_dtype=torch.float64, **kw),
        v,
        torch.bfloat16,
        "SAME apart",
        lam=0.6,
    )
    heads.clear()
    two = SWA(
        *(t.contiguous() for t in (q, k, v)), 17, **dict(kw, q2=q2.contiguous(), k2=k2.contiguous())
    )
    assert heads == [H, H]
    if DEVICE == "cpu":
        assert torch.equal(out, two)


@pytest.mark.slow
@torch.no_grad()
def test_replay_keeps_the_one_pass_to_heads_that_follow():
    """The one-pass prologue reads Q2 as the heads behind Q: a repeat call whose tensors
    have the same shapes and strides but whose Q2 / K2 lie elsewhere (chunks of another
    projection) must not replay that launch (the relation is part of the call's key)."""
    g = torch.Generator().manual_seed(23)
    B, N, H, D, R = 1, 33, 2, 64, 32
    bufs = [rnd(g, B, N, 5 * H * D, dtype=torch.bfloat16) for _ in range(2)]
    a = [t.unflatten(-1, (H, D)) for t in bufs[0].chunk(5, -1)]
    b = [t.unflatten(-1, (H, D)) for t in bufs[1].chunk(5, -1)]
    cos, sin = same_tables(N, R)
    kw = dict(
        q_norm=dyt(g, D, torch.bfloat16),
        k_norm=dyt(g, D, torch.bfloat16),
        cos=cos,
        sin=sin,
        rotary_dim=R,
        lam=0.5,
    )
    SWA(a[0], a[2], a[4], 17, q2=a[1], k2=a[3], **kw)  # records the one-pass launches
    # q2 / k2 from the other buffer: same signature tensor by tensor, not behind q / k
    out = SWA(a[0], a[2], a[4], 17, q2=b[1], k2=b[3], **kw)
    kw2 = dict(kw, q2=b[1], k2=b[3])
    check(
        out,
        reference(a[0], a[2], a[4], 17, compute_dtype=torch.float64, **kw2),
        a[4],
        torch.bfloat16,
        "replay, Q2 elsewhere",
        lam=0.5,
    )


def test_joint_prologue_plan_conditions():
    """Where the one-pass prologue applies (``_joint_plan``): heads that follow, per-head
    norms, a table shared by the heads; not with one head a token (its pass would take the
    flat-row kernel), a per-head table, or Q2 / K2 elsewhere."""
    g = torch.Generator().manual_seed(5)

    def plan_of(H, *, packed=True, per_head_table=False):
        N, D, R = 9, 64, 32
        if packed:
            buf = rnd(g, 1, N, 5 * H * D, dtype=torch.bfloat16)
            q, q2, k, k2, v = (t.unflatten(-1, (H, D)) for t in buf.chunk(5, -1))
        else:
            q, k, v, q2, k2 = qkv(g, 1, N, H, D, torch.bfloat16, n=5)
        cos, sin = same_tables(N, R)
        if per_head_table:
            cos, sin = (t[None, :, None].expand(1, N, H, R).contiguous() for t in (cos, sin))
        p = A.plan(
            q,
            k,
            v,
            17,
            q2=q2,
            k2=k2,
            q_norm=dyt(g, D, torch.bfloat16),
            k_norm=dyt(g, D, torch.bfloat16),
            cos=cos,
            sin=sin,
            rotary_dim=R,
        )
        return A._joint_plan(p, A.prologue_scratch(q, "bshd", True))

    joint = plan_of(3)
    assert joint is not None and joint.q.shape[2] == 6 and joint.cos.shape[2] == 6
    assert plan_of(3, packed=False) is None
    assert plan_of(3, per_head_table=True) is None
    # one head, RMS over it, interleaved RoPE over all of it: the flat-row kernel's case
    N, D = 9, 64
    buf = rnd(g, 1, N, 5 * D, dtype=torch.bfloat16)
    q, q2, k, k2, v = (t.unflatten(-1, (1, D)) for t in buf.chunk(5, -1))
    cos, sin = (t[:, : D // 2].repeat_interleave(2, -1) for t in same_tables(N, D))
    rms = NormSpec("rms", weight=rnd(g, D, dtype=torch.bfloat16, scale=0.2) + 1, eps=1e-6)
    p = A.plan(
        q,
        k,
        v,
        17,
        q2=q2,
        k2=k2,
        q_norm=rms,
        k_norm=rms,
        cos=cos,
        sin=sin,
        rope_style="interleaved",
        rotary_dim=D,
    )
    scratch = A.prologue_scratch(q, "bshd", True)
    import importlib

    assert importlib.import_module("ditfuse.ops.qk_norm_rope").flat_applies(
        p.qk, scratch[0], scratch[1]
    )
    assert A._joint_plan(p, scratch) is None
