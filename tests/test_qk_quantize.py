"""``ditfuse.qk_norm_rope(..., quantize="int8" | "fp8")``: 8-bit output with one fp32 scale per
(batch, head, token), from the kernel and form that the call without ``quantize`` takes (the
per-token kernel, or the flat-row kernel's pair or channel form for a norm across heads with
whole-head interleaved RoPE -- Wan), bitwise equal to ``ditfuse.reference.quantize_per_token``
of that call's 16-bit output (every norm, RoPE style, table form, layout and dtype), within the
reference's tolerance of the fp64 reference's quantization; every element written (outputs
start as values the quantization never produces), zero heads, head groups, bad arguments, the
fast-path cache and the ``torch.library`` op under ``torch.compile``."""

import itertools
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch
import triton.language as tl
from conftest import DEVICE, DTYPES, TOL, rope_tables
from test_qk_norm_rope import make_norm, make_qk, make_tables

import ditfuse
from ditfuse import NormSpec, QuantizedQK
from ditfuse.aot.compile import missing_tools
from ditfuse.kernels.common import _quant_ptr, _quant_values
from ditfuse.kernels.element import _cast_out
from ditfuse.kernels.qk_flat import _qk_norm_rope_flat_kernel
from ditfuse.reference import quantize_per_token
from ditfuse.runtime import fastpath
from ditfuse.runtime.backend import jit
from ditfuse.tolerances import UNIT_ROUNDOFF

mod = sys.modules["ditfuse.ops.qk_norm_rope"]

FORMATS = ["int8", "fp8"]
QMAX = {"int8": 127.0, "fp8": 448.0}
#: half the spacing of each format's values relative to |t| (normal fp8: 3 fraction bits),
#: and absolutely (int8: 0.5; fp8 subnormals: 2^-10), in units of the scale
HALF_STEP = {"int8": (0.0, 0.5), "fp8": (2.0**-4, 2.0**-10)}
_QCODE = {"int8": 1, "fp8": 2}
SENTINEL = {torch.int8: -128, torch.float8_e4m3fn: float("nan"), torch.float32: float("nan")}


@pytest.fixture
def poison_quant(monkeypatch):
    """Every 8-bit output starts as a value the quantization never writes (int8 -128, fp8
    and scale NaN)."""

    def full(shape, dtype, device):
        if dtype == torch.float8_e4m3fn:
            return torch.full(shape, 0x7F, dtype=torch.uint8, device=device).view(dtype)
        return torch.full(shape, SENTINEL[dtype], dtype=dtype, device=device)

    monkeypatch.setattr(mod, "_quant_empty", full)


@pytest.fixture
def launches(monkeypatch):
    """Every call launches (no replays); collects each launch as (kernel, grid, launch
    options and constexprs but QUANT, QUANT): a quantizing call must launch what the 16-bit
    call launches, so that its fp32 statistics run in the same order. (The tensors' stride
    tuples, also keyword arguments, are run-time values: the scales' are the 8-bit call's.)"""
    monkeypatch.setattr(fastpath, "ENABLED", False)
    seen = []
    orig = fastpath.launch

    def record(kernel, grid, args, kw):
        seen.append(
            (
                kernel,
                tuple(grid),
                {k: v for k, v in kw.items() if k != "QUANT" and not k.endswith("_strides")},
                kw.get("QUANT", 0),
            )
        )
        return orig(kernel, grid, args, kw)

    monkeypatch.setattr(fastpath, "launch", record)
    return seen


def _quantize_as_16_bit(launches, q, k, cos, sin, fmts, **kw):
    """The 16-bit call's outputs, and for each format the quantizing call's result, which
    launched the same kernel with the same settings."""
    launches.clear()
    y16 = ditfuse.qk_norm_rope(q, k, cos, sin, **kw)
    assert len(launches) == 1 and launches[0][3] == 0
    want = launches[0]
    out = {}
    for fmt in fmts:
        launches.clear()
        out[fmt] = ditfuse.qk_norm_rope(q, k, cos, sin, quantize=fmt, **kw)
        assert [x[:3] for x in launches] == [want[:3]], (
            "the quantizing call launched another kernel, form or launch setting"
        )
        assert launches[0][3] == _QCODE[fmt]
    return y16, want, out


def _bits(t):
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


def _heads(v, layout, H):
    """(B, S, H, D) view of a values tensor in the caller's shape."""
    if v.dim() == 3:
        return v.unflatten(2, (H, v.shape[2] // H))
    return v if layout == "bshd" else v.transpose(1, 2)


def _dequant(v, s, layout, H):
    """fp32 values times their (B, H, S) scales, as (B, S, H, D)."""
    return _heads(v, layout, H).float() * s.transpose(1, 2)[..., None]


def _check_written(res, fmt, layout, H):
    """Every value and scale written; each nonzero head row reaches the format's maximum."""
    for v, s in ((res.q, res.q_scale), (res.k, res.k_scale)):
        if v is None:
            assert s is None
            continue
        assert s.dtype == torch.float32 and s.is_contiguous() and v.is_contiguous()
        assert torch.isfinite(s).all() and (s > 0).all()
        if fmt == "int8":
            assert (v != -128).all()
        else:
            assert not v.float().isnan().any()
        amax = _heads(v, layout, H).float().abs().amax(-1).transpose(1, 2)  # (B, H, S)
        zero = amax == 0
        assert (amax[~zero] == QMAX[fmt]).all()
        assert (s[zero] == 1.0).all()


def _check_against(res, y16, fmt, layout, H):
    """Bitwise quantize_per_token of the 16-bit output ``y16`` = (q, k)."""
    for v, s, y in ((res.q, res.q_scale, y16[0]), (res.k, res.k_scale, y16[1])):
        if y is None:
            assert v is None and s is None
            continue
        wv, ws = quantize_per_token(y, fmt, layout=layout, num_heads=H)
        assert v.shape == y.shape and v.dtype == wv.dtype and s.shape == ws.shape
        bad = _bits(v) != _bits(wv)
        assert not bad.any(), (
            f"{int(bad.sum())} of {v.numel()} values differ",
            v[bad][:8],
            wv[bad][:8],
        )
        assert torch.equal(s, ws)


def _check_reference(res, ref, ref16, fmt, dtype, layout, H):
    """Within the reference's tolerance: the scales within the 16-bit outputs' tolerance of
    the reference's (the amax moves with one element), each dequantized value within half
    a step of the format (plus the 16-bit tolerance) of the reference's 16-bit output."""
    tol = TOL[dtype]
    rel, absolute = HALF_STEP[fmt]
    for v, s, rs, y in (
        (res.q, res.q_scale, ref.q_scale, ref16[0]),
        (res.k, res.k_scale, ref.k_scale, ref16[1]),
    ):
        if y is None:
            continue
        floor = tol["rtol"] * y.float().pow(2).mean().sqrt().item()  # as assert_close_report
        torch.testing.assert_close(
            s, rs, rtol=tol["rtol"], atol=max(tol["atol"], floor) / QMAX[fmt]
        )
        yr = _heads(y, layout, H).float()
        err = (_dequant(v, s, layout, H) - yr).abs()
        u = UNIT_ROUNDOFF[torch.float32].rtol
        bound = (
            (rel * yr.abs() + absolute * s.transpose(1, 2)[..., None]) * (1 + 4 * u)
            + tol["rtol"] * yr.abs()
            + max(tol["atol"], floor)
        )
        assert (err <= bound).all(), float((err - bound).max())


def _run_case(launches, kind, span, style, dtype, H, D, table, form, partial, B, S, fmts):
    g = torch.Generator().manual_seed(
        zlib.crc32(f"q8{kind}{span}{style}{dtype}{table}{form}{S}".encode())
    )
    q, k, kw, _ = make_qk(form, B, S, H, D, dtype, g)
    qn = make_norm(kind, span, H, D, dtype, g)
    kn = make_norm(kind, span, H, D, dtype, g)
    cos = sin = None
    if style is not None:
        R = D // 2 if partial else D
        R -= R % 2
        cos, sin, tkw = make_tables(table, B, S, H, R, style, g)
        kw.update(tkw, rope_style=style)
    layout = kw.get("layout", "bshd")
    q_in, k_in = q.clone(), k.clone()
    y16, _, results = _quantize_as_16_bit(
        launches, q, k, cos, sin, fmts, q_norm=qn, k_norm=kn, **kw
    )
    ref16 = ditfuse.qk_norm_rope_reference(
        q, k, cos, sin, q_norm=qn, k_norm=kn, compute_dtype=torch.float64, **kw
    )
    for fmt in fmts:
        res = results[fmt]
        assert isinstance(res, QuantizedQK)
        assert torch.equal(q, q_in) and torch.equal(k, k_in), "inputs changed"
        assert res.q_scale.shape == (B, H, S) and res.k_scale.shape == (B, H, S)
        assert res.q.shape == q.shape and res.q.dtype == mod.QUANT_DTYPES[fmt]
        _check_written(res, fmt, layout, H)
        _check_against(res, y16, fmt, layout, H)
        ref = ditfuse.qk_norm_rope_reference(
            q, k, cos, sin, q_norm=qn, k_norm=kn, compute_dtype=torch.float64, quantize=fmt, **kw
        )
        assert isinstance(ref, QuantizedQK)
        _check_reference(res, ref, ref16, fmt, dtype, layout, H)


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
HEAD_SHAPES = [(3, 64), (5, 32), (2, 80), (6, 16), (1, 128), (7, 24)]


def _sweep():
    """Each (norm, span, rotary style) once (33 cases, not the 99 of the cross product with
    the dtypes: the interpreter's time is per program); the dtype turns with the style's
    turn, so every style meets every dtype, and the head shape, table form, layout, partial
    rotary, batch and token count cycle, so each value of each occurs (both formats every
    case)."""
    out = []
    triples = [
        t for t in itertools.product(NORMS, SPANS, STYLES) if not (t[0] is None and t[1] == "all")
    ]
    for i, (kind, span, style) in enumerate(triples):
        dtype = DTYPES[(i + i // 3) % len(DTYPES)]
        H, D = HEAD_SHAPES[i % len(HEAD_SHAPES)]
        table = TABLES[i % len(TABLES)]
        form = FORMS[(i // 2) % len(FORMS)]
        partial = style is not None and i % 4 == 1
        B = 1 + i % 2
        S = 7 if i % 5 == 3 else 3
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
                B,
                S,
                id=f"{kind}-{span}-{style}-{str(dtype)[6:]}-{H}x{D}-{table}-{form}"
                f"{'-partial' if partial else ''}-B{B}-S{S}",
            )
        )
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind,span,style,dtype,H,D,table,form,partial,B,S", _sweep())
@torch.no_grad()
def test_sweep(kind, span, style, dtype, H, D, table, form, partial, B, S, launches, poison_quant):
    _run_case(launches, kind, span, style, dtype, H, D, table, form, partial, B, S, FORMATS)


# the default tier: one case per norm kind, both spans, both rotary styles and no RoPE,
# every layout, dtype and format, two pieces of heads (5 = 4 + 1, 7 = 4 + 3 -> 4 + 4 masked),
# partial rotary, half-width / per-head / gathered tables, S = 17 and 37
FAST = [
    ("rms", "head", "interleaved", torch.bfloat16, 3, 64, "S,W", "bshd", False, 2, 5, "int8"),
    ("rms", "all", "interleaved", torch.bfloat16, 5, 32, "1,S,1,W", "flat", False, 1, 17, "fp8"),
    ("layer", "all", "half", torch.float16, 3, 64, "B,S,W", "bhsd", False, 2, 4, "int8"),
    ("dyt", "head", "half", torch.bfloat16, 5, 32, "unique", "packed", False, 1, 5, "fp8"),
    (
        "rms_roundw",
        "head",
        "interleaved",
        torch.float16,
        7,
        24,
        "S,H,W",
        "strided_d",
        True,
        1,
        4,
        "int8",
    ),
    ("rms_noaffine", "head", "half", torch.float32, 2, 80, "pos_b", "bshd", True, 2, 3, "fp8"),
    (None, "head", "interleaved", torch.bfloat16, 6, 16, "unique", "bhsd", False, 1, 37, "int8"),
    ("layer", "head", None, torch.bfloat16, 1, 128, None, "flat", False, 2, 4, "fp8"),
    ("dyt", "all", "interleaved", torch.float32, 3, 64, "pos", "packed", True, 1, 5, "int8"),
    ("rms", "head", "half", torch.float16, 5, 32, "B,S,H,W", "flat", False, 2, 3, "fp8"),
]


@pytest.mark.parametrize(
    "kind,span,style,dtype,H,D,table,form,partial,B,S,fmt",
    [
        pytest.param(
            *c,
            id=f"{c[0]}-{c[1]}-{c[2]}-{str(c[3])[6:]}-{c[4]}x{c[5]}-{c[6]}-{c[7]}"
            f"{'-partial' if c[8] else ''}-B{c[9]}-S{c[10]}-{c[11]}",
        )
        for c in FAST
    ],
)
@torch.no_grad()
def test_representative(
    kind, span, style, dtype, H, D, table, form, partial, B, S, fmt, launches, poison_quant
):
    _run_case(launches, kind, span, style, dtype, H, D, table, form, partial, B, S, [fmt])


@pytest.mark.parametrize("fmt", FORMATS)
@torch.no_grad()
def test_zero_head_and_k_none(fmt, poison_quant):
    """A head whose output is all zeros: scale 1, values 0; the other heads of the token
    keep their own scales. Without K: k and k_scale None."""
    g = torch.Generator().manual_seed(3)
    B, S, H, D, dtype = 2, 3, 3, 32, torch.bfloat16
    q = (torch.randn(B, S, H, D, generator=g) * 2 + 0.3).to(dtype).to(DEVICE)
    q[1, 2, 1] = 0
    q[0, 0, 2] = 0
    cos, sin = rope_tables(S, D)
    norm = NormSpec(
        "rms", weight=(torch.randn(D, generator=g) - 0.2).to(dtype).to(DEVICE), eps=1e-6
    )
    res = ditfuse.qk_norm_rope(q, None, cos, sin, q_norm=norm, quantize=fmt)
    assert res.k is None and res.k_scale is None
    assert res.q_scale[1, 1, 2] == 1.0 and res.q_scale[0, 2, 0] == 1.0
    assert (res.q[1, 2, 1].float() == 0).all() and (res.q[0, 0, 2].float() == 0).all()
    _check_written(res, fmt, "bshd", H)
    y, _ = ditfuse.qk_norm_rope(q, None, cos, sin, q_norm=norm)
    _check_against(res, (y, None), fmt, "bshd", H)


@pytest.mark.parametrize("fmt", FORMATS)
@torch.no_grad()
def test_tiny_heads(fmt, poison_quant):
    """fp32 heads whose amax is so small that M / amax passes the largest fp32 (amax < 4e-37:
    subnormal and tiny normal values): the reciprocal is capped, values stay finite and in
    range, and the bits are the reference's."""
    D = 16
    vals = torch.tensor([1e-38, -3e-39, 1e-45, 0.0, 2e-40, -1e-38, 5e-39, 1e-44] * 2)
    x = vals.reshape(1, 1, 1, D).to(DEVICE)
    r = ditfuse.qk_norm_rope(x, None, quantize=fmt)
    assert torch.isfinite(r.q.float()).all() and torch.isfinite(r.q_scale).all()
    _check_against(r, (x, None), fmt, "bshd", 1)


@torch.no_grad()
def test_ties_round_to_even(poison_quant):
    """No norm, no RoPE: y = x. A head row whose amax is 127 (448) has scale 1, so the
    quantized value is the rounding of x itself: ties go to even (int8: 2.5 -> 2, -3.5 -> -4;
    fp8: 1.0625 -> 1, 1.1875 -> 1.25, 17 -> 16, subnormal 1.5 * 2^-9 -> 2^-8, 2^-10 -> 0)."""
    D = 16
    row8 = [
        127.0,
        2.5,
        -2.5,
        3.5,
        -3.5,
        0.5,
        -0.5,
        1.5,
        126.5,
        -126.5,
        0.25,
        0.75,
        -1.5,
        4.5,
        5.5,
        0.0,
    ]
    rowf = [
        448.0,
        1.0625,
        1.1875,
        -1.0625,
        17.0,
        -19.0,
        1.5 * 2**-9,
        2.0**-10,
        -(2.0**-10),
        2.5 * 2**-9,
        240.0,
        232.0,
        0.0,
        3.0 * 2**-9,
        -416.0,
        15.0 * 2**-10,
    ]
    want8 = [127, 2, -2, 4, -4, 0, 0, 2, 126, -126, 0, 1, -2, 4, 6, 0]
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x8 = torch.tensor(row8).reshape(1, 1, 1, D).to(dtype).to(DEVICE)
        xf = torch.tensor(rowf).reshape(1, 1, 1, D).to(dtype).to(DEVICE)
        assert x8.float().flatten().tolist() == row8 and xf.float().flatten().tolist() == rowf
        r8 = ditfuse.qk_norm_rope(x8, None, quantize="int8")
        assert r8.q_scale.item() == 1.0 and r8.q.flatten().tolist() == want8
        rf = ditfuse.qk_norm_rope(xf, None, quantize="fp8")
        assert rf.q_scale.item() == 1.0
        wf = torch.tensor(rowf).to(torch.float8_e4m3fn)  # torch rounds to nearest even
        assert torch.equal(_bits(rf.q.flatten().cpu()), _bits(wf))
        assert rf.q.flatten()[1:8].float().tolist() == [1.0, 1.25, -1.0, 16.0, -20.0, 2.0**-8, 0.0]
        assert _bits(rf.q.flatten())[8].item() == 0x80  # -2^-10 -> -0
        for r, y in ((r8, x8), (rf, xf)):
            _check_against(r, (y, None), "int8" if r is r8 else "fp8", "bshd", 1)


@jit
def _rounding_kernel(y_ptr, o_ptr, inv, N, BLOCK: tl.constexpr, QUANT: tl.constexpr):
    """The 8-bit rounding of the per-token kernel's store, on a flat array."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    y = tl.load(y_ptr + i, mask=m, other=0.0)
    qo_ptr = _quant_ptr(o_ptr, QUANT)
    tl.store(qo_ptr + i, _cast_out(_quant_values(y, inv, QUANT), qo_ptr.dtype.element_ty), mask=m)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("inv", [1.0, 2.0**-3, 1 / 0.37, 1 / 3.0e-3])
def test_rounding_matches_torch(fmt, inv):
    """The kernel's ``y * inv`` and rounding (``_quant_values`` and the store's cast) against
    PyTorch's over every finite bf16 and fp16 value in range, every midpoint of the format's
    grid (ties: exact ones where ``inv`` is a power of two) and random fp32 values of every
    binade down to subnormal results."""
    qmax = QMAX[fmt]
    g = torch.Generator().manual_seed(1)
    inv = float(torch.tensor(inv, dtype=torch.float32))  # the fp32 value the kernel gets
    scale = 1 / inv
    lim = qmax * scale
    pools = [
        torch.arange(-(2**15), 2**15, dtype=torch.int32)
        .to(torch.int16)
        .view(torch.bfloat16)
        .float(),
        torch.arange(-(2**15), 2**15, dtype=torch.int32)
        .to(torch.int16)
        .view(torch.float16)
        .float(),
    ]
    if fmt == "int8":
        grid = torch.arange(-127, 128, dtype=torch.float32)
    else:
        grid = (
            torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
        )
        grid = grid[grid.isfinite()].unique()
    mids = (grid[1:] + grid[:-1]) / 2  # exact in fp32: ties of the format's rounding
    pools += [mids * scale, grid * scale, (mids + mids.abs() * 2**-20) * scale]
    e = torch.rand(2**16, generator=g) * 40 - 30
    pools.append(torch.exp2(e) * (torch.rand(2**16, generator=g) * 2 - 1) * lim)
    y = torch.cat(pools)
    y = y[y.isfinite() & (y.abs() <= lim)].contiguous()
    ref = y * torch.tensor(inv, dtype=torch.float32)
    if fmt == "int8":
        ref = torch.round(ref).clamp(-127, 127).to(torch.int8)
    else:
        ref = ref.to(torch.float8_e4m3fn)
    out = torch.full(y.shape, 1, dtype=torch.uint8).view(ref.dtype).to(DEVICE)
    block = 65536 if DEVICE == "cpu" else 1024
    n = y.numel()
    _rounding_kernel[(-(-n // block),)](
        y.to(DEVICE), out, inv, n, BLOCK=block, QUANT=1 if fmt == "int8" else 2
    )
    bad = _bits(out.cpu()) != _bits(ref)
    assert not bad.any(), (int(bad.sum()), y[bad][:8], out.cpu()[bad][:8], ref[bad][:8])


@pytest.mark.parametrize("settings", [(5, 2), (2, 2), (3, 4), (1, 2)])
@torch.no_grad()
def test_heads_per_program_same_bits(settings, poison_quant):
    """Heads in groups of 1, 2, 3 (pieces 2 + 1) or all 5 (4 + 1) per program: each head's
    amax is its own, the same bits."""
    g = torch.Generator().manual_seed(8)
    B, S, H, D, dtype = 1, 3, 5, 32, torch.bfloat16
    q = (torch.randn(B, S, H, D, generator=g) * 2).to(dtype).to(DEVICE)
    k = (torch.randn(B, S, H, D, generator=g) * 2).to(dtype).to(DEVICE)
    cos, sin = rope_tables(S, D, style="half")
    norm = NormSpec(
        "layer",
        weight=(torch.randn(D, generator=g) + 1).to(dtype).to(DEVICE),
        bias=torch.randn(D, generator=g).to(dtype).to(DEVICE),
        eps=1e-6,
    )
    p = mod.plan(q, k, cos, sin, q_norm=norm, k_norm=norm, rope_style="half")
    want = ditfuse.qk_norm_rope(
        q, k, cos, sin, q_norm=norm, k_norm=norm, rope_style="half", quantize="int8"
    )
    got = mod._quant_outputs(q, k, "int8", None, "bshd")
    heads, warps = settings
    st = mod.launch_settings(H, D, flat=False, has_k=True, itemsize=2, heads=heads, num_warps=warps)
    mod.launch(p, got.q, got.k, settings=st, quant=("int8", got.q_scale, got.k_scale))
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
@torch.no_grad()
def test_head_groups_with_masked_heads(fmt, launches, poison_quant):
    """40 heads of 256 channels: 16 heads a program (the launch table), the last group
    masked (8 of 16)."""
    _run_case(
        launches,
        "rms",
        "head",
        "interleaved",
        torch.bfloat16,
        40,
        256,
        "S,W",
        "bshd",
        False,
        1,
        2,
        [fmt],
    )


# Wan's form (a norm across every head, interleaved RoPE over whole heads): the flat-row
# kernel, in its pair form (16-bit rows pair-aligned, Q and K in programs of their own) or its
# channel form (fp32; rows not contiguous; the pair form turned off: contiguous rows a channel
# a lane; Q alone). Token rows as two pieces of uneven sizes: 5120 = 4096 + 1024 (Wan 14B),
# 1536 = 1024 + 512 at head_dim 128 (Wan 1.3B) and 64, 224 = 128 + 128 with the second piece
# masked (a dead head)
WAN_SHAPES = [(40, 128), (12, 128), (24, 64), (7, 32)]
WAN_FORMS = [
    (torch.bfloat16, "pairs"),
    (torch.bfloat16, "channel"),
    (torch.float16, "pairs"),
    (torch.float16, "channel"),
    (torch.float32, "channel"),
]
WAN_FAST = {
    ((40, 128), torch.bfloat16, "pairs"),
    ((12, 128), torch.float16, "channel"),
    ((24, 64), torch.float32, "channel"),
    ((7, 32), torch.bfloat16, "bhsd"),
    ((12, 128), torch.bfloat16, "q-only"),
}


def _wan_cases():
    out = []
    cases = [(hd, dt, form) for hd in WAN_SHAPES for dt, form in WAN_FORMS]
    cases += [
        ((7, 32), torch.bfloat16, "bhsd"),
        ((40, 128), torch.float16, "bhsd"),
        ((12, 128), torch.bfloat16, "q-only"),
        ((24, 64), torch.float32, "q-only"),
    ]
    for i, (hd, dtype, form) in enumerate(cases):
        table = ("unique", "1,S,1,W", "S,W")[i % 3]  # half-width (patched Wan), Wan's own, 2-D
        B, S = (1, 5) if i % 2 else (2, 3)
        marks = () if (hd, dtype, form) in WAN_FAST else (pytest.mark.slow,)
        out.append(
            pytest.param(
                hd,
                dtype,
                form,
                table,
                B,
                S,
                marks=marks,
                id=f"{hd[0]}x{hd[1]}-{str(dtype)[6:]}-{form}-{table}-B{B}-S{S}",
            )
        )
    return out


@pytest.mark.parametrize("hd,dtype,form,table,B,S", _wan_cases())
@torch.no_grad()
def test_norm_across_heads_bitwise(
    hd, dtype, form, table, B, S, launches, monkeypatch, poison_quant
):
    """Wan's form quantizes the 16-bit call's own output bitwise: the quantizing call runs
    the flat-row kernel in the form the 16-bit call takes (the fp32 sum of squares in the
    same order), each head of a piece with its own scale; a zero head of a token: scale 1."""
    H, D = hd
    g = torch.Generator().manual_seed(zlib.crc32(f"wan{hd}{dtype}{form}{table}".encode()))
    q, k, kw, _ = make_qk("bhsd" if form == "bhsd" else "flat", B, S, H, D, dtype, g)
    (q if form == "bhsd" else q.unflatten(2, (H, D)).transpose(1, 2))[B - 1, H // 2, S - 1] = 0
    if form == "q-only":
        k = None
    qn = make_norm("rms", "all", H, D, dtype, g)
    kn = make_norm("rms", "all", H, D, dtype, g) if k is not None else None
    cos, sin, tkw = make_tables(table, B, S, H, D, "interleaved", g)
    kw.update(tkw, q_norm=qn, k_norm=kn)
    if form == "channel" and dtype != torch.float32:
        monkeypatch.setattr(mod, "pairs_applies", lambda *a: False)
    layout = kw.get("layout", "bshd")
    p = mod.plan(q, k, cos, sin, **kw)
    assert mod.flat_applies(p, p.q, p.k)
    y16, launch, res = _quantize_as_16_bit(launches, q, k, cos, sin, FORMATS, **kw)
    opts = launch[2]
    assert launch[0] is _qk_norm_rope_flat_kernel and "N0" in opts
    assert opts.get("PAIRS", False) == (form == "pairs")
    assert opts["ROW_CONTIG"] == (form != "bhsd")
    assert opts["SPLIT_QK"] == (k is not None) and opts["N1"] > 0
    for fmt in FORMATS:
        r = res[fmt]
        _check_written(r, fmt, layout, H)
        _check_against(r, y16, fmt, layout, H)
        assert r.q_scale[B - 1, H // 2, S - 1] == 1.0


@pytest.mark.parametrize("fmt", FORMATS)
@torch.no_grad()
def test_flat_split_and_warps_same_bits(fmt, poison_quant):
    """The flat kernel quantizing with Q and K in programs of their own or together (the
    channel form's two paths) and at other warps: the bits of the public call (the
    interpreter has no warps; on the GPU the fp32 sums follow the warps, which the launch
    keeps equal to the 16-bit call's)."""
    H, D, dtype = 5, 32, torch.float32
    g = torch.Generator().manual_seed(21)
    q, k, kw, _ = make_qk("flat", 2, 3, H, D, dtype, g)
    qn = make_norm("layer", "all", H, D, dtype, g)
    kn = make_norm("layer", "all", H, D, dtype, g)
    cos, sin, tkw = make_tables("1,S,1,W", 2, 3, H, D, "interleaved", g)
    kw.update(tkw, q_norm=qn, k_norm=kn)
    p = mod.plan(q, k, cos, sin, **kw)
    assert mod.flat_applies(p, p.q, p.k)
    want = ditfuse.qk_norm_rope(q, k, cos, sin, quantize=fmt, **kw)
    for warps, split in ((1, True), (1, False), (4, False)):
        got = mod._quant_outputs(q, k, fmt, H, "bshd")
        mod.launch_flat(
            p,
            _heads(got.q, "bshd", H),
            _heads(got.k, "bshd", H),
            num_warps=warps,
            split=split,
            quant=(fmt, got.q_scale, got.k_scale),
        )
        for a, b in zip(got, want):
            assert torch.equal(_bits(a), _bits(b)), (warps, split)


# Built for sm_90 in a child process (compiling needs TRITON_INTERPRET=0 before Triton defines
# the kernels): the fp32 sums of each build, as (kernel, operand shape, operand layout) of
# each add-reduction. The interpreter sums in numpy's order whatever the layout; on the GPU a
# reduction's order follows its operand's register layout, which the coalescing pass derives
# from the memory accesses of the same shape -- an 8-bit store among them must not change it
# (common._same_order).
_SUM_LAYOUTS = r"""
import dataclasses, json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ditfuse.aot.compile import ARCH, specialize
from ditfuse.tools import inspect as ins

def sums(spec):
    grid, args, kwargs = ins.capture_launch(spec)
    kernel = ins.qk_kernel_of(kwargs)
    target = GPUTarget("cuda", ARCH, 32)
    sig, cex, attrs, opts = specialize(kernel, args, kwargs, target)
    ttgir = triton.compile(ASTSource(kernel, sig, cex, attrs), target=target,
                           options=opts.__dict__).asm["ttgir"]
    alias = dict(re.findall(r"^(#\w+) = (#ttg\.\S.*)$", ttgir, re.M))
    out = []
    for m in re.finditer(r'"tt\.reduce".*?\n(.*?)\}\) : \((tensor<[^>]*?, (#\w+)>)\)', ttgir, re.S):
        if re.search(r"arith\.addf", m.group(1)):
            out.append([kernel.fn.__name__, m.group(2).split(",")[0], alias[m.group(3)]])
    return out

rows = {}
for name, over in json.loads(sys.argv[1]):
    base = dataclasses.replace(next(s for s in ins.SPECS if s.name == name), packed=0, **over)
    rows[name + json.dumps(over)] = {str(q): sums(dataclasses.replace(base, quantize=q))
                                     for q in (None, "int8", "fp8")}
print(json.dumps(rows))
"""


@pytest.mark.slow
@pytest.mark.skipif(bool(missing_tools()), reason="the Triton wheel has no ptxas / cuobjdump")
def test_sm90_builds_sum_in_the_16_bit_order():
    """On sm_90 the quantizing builds reduce the fp32 statistics over the register layouts
    of the 16-bit builds (the summation order, so the bits, of the norm). The flat-row
    kernel: the pair form (Wan 14B bf16 with half-width tables; fp16), the channel form with
    contiguous rows (fp32) and strided ones (bhsd), a masked second piece (7 x 32). The
    per-token kernel: FLUX.2 in bf16 (pairs a word) and fp32 (pairs split from channel rows,
    whose 8-bit store shares their shape), Stable Audio 3's partial rotate-half with
    pass-through channels."""
    specs = [
        ("wan14b-half-table", {}),
        ("wan14b-fp16", {}),
        ("wan14b-fp32", {}),
        ("wan14b", {"layout": "bhsd"}),
        ("wan14b", {"H": 7, "D": 32}),
        ("flux2", {}),
        ("flux2-fp32", {}),
        ("sa3", {"dtype": "fp32"}),
    ]
    env = dict(os.environ, TRITON_INTERPRET="0")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(ditfuse.__file__).parents[1])]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    r = subprocess.run(
        [sys.executable, "-c", _SUM_LAYOUTS, json.dumps(specs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(rows) == len(specs)
    for name, builds in rows.items():
        want = builds["None"]
        flat = name.startswith("wan")
        assert want and all((k == "_qk_norm_rope_flat_kernel") == flat for k, _, _ in want), (
            name,
            want,
        )
        for q in ("int8", "fp8"):
            assert builds[q] == want, (name, q, builds[q], want)


@pytest.mark.parametrize("fmt", FORMATS)
@torch.no_grad()
def test_fallback_without_kernels(fmt, monkeypatch, poison_quant):
    """Where Triton cannot run (e.g. CPU tensors on a CUDA machine): the fp32 reference's
    output, quantized by quantize_per_token -- the reference's own quantize= result."""
    g = torch.Generator().manual_seed(6)
    q = (torch.randn(2, 3, 4, 16, generator=g) * 2).to(torch.bfloat16).to(DEVICE)
    k = (torch.randn(2, 3, 4, 16, generator=g) * 2).to(torch.bfloat16).to(DEVICE)
    cos, sin = rope_tables(4, 16, style="half")
    norm = NormSpec("layer", weight=(torch.randn(16, generator=g) + 1).to(DEVICE), eps=1e-5)
    kw = dict(q_norm=norm, k_norm=norm, rope_style="half", layout="bhsd")
    monkeypatch.setattr(mod.backend, "kernel_device_ok", lambda t: False)
    got = ditfuse.qk_norm_rope(q, k, cos, sin, quantize=fmt, **kw)
    want = ditfuse.qk_norm_rope_reference(q, k, cos, sin, quantize=fmt, **kw)
    assert got.q_scale.shape == (2, 3, 4)
    for a, b in zip(got, want):
        assert torch.equal(_bits(a), _bits(b))
    _check_written(got, fmt, "bhsd", 3)


@torch.no_grad()
def test_bad_arguments():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 2, 16, generator=g).to(torch.bfloat16).to(DEVICE)
    k = torch.randn(1, 2, 2, 16, generator=g).to(torch.bfloat16).to(DEVICE)
    for bad in ("int4", "INT8", 8, True, ""):
        with pytest.raises(ValueError, match=r"quantize must be None or one of \('int8', 'fp8'\)"):
            ditfuse.qk_norm_rope(q, k, quantize=bad)
    with pytest.raises(ValueError, match="quantize must be"):
        ditfuse.qk_norm_rope_reference(q, k, quantize="int4")
    with pytest.raises(ValueError, match="inplace=True"):
        ditfuse.qk_norm_rope(q, k, inplace=True, quantize="int8")
    with pytest.raises(ValueError, match="out="):
        ditfuse.qk_norm_rope(q, k, out=(torch.empty_like(q), torch.empty_like(k)), quantize="fp8")
    with pytest.raises(ValueError, match="process_group"):
        ditfuse.qk_norm_rope(q, k, process_group=object(), quantize="int8")
    with pytest.raises(ValueError, match="fmt must be one of"):
        quantize_per_token(q, "int4")
    # without quantize: today's plain pair
    out = ditfuse.qk_norm_rope(q, k)
    assert type(out) is tuple and len(out) == 2


@torch.no_grad()
def test_replays_keep_formats_apart(monkeypatch, poison_quant):
    """One signature called 16-bit, int8, fp8, then each again with fresh data: the repeats
    replay their own format's recording (the cache key holds ``quantize``), equal to the
    checked path bitwise."""
    mod._CACHE.clear()
    n = [0]
    orig = fastpath.Replay.__call__

    def counted(self, tensors):
        n[0] += 1
        return orig(self, tensors)

    monkeypatch.setattr(fastpath.Replay, "__call__", counted)
    B, S, H, D, dtype = 1, 3, 2, 32, torch.bfloat16
    g = torch.Generator().manual_seed(4)
    # two norms: a tensor passed twice (one weight for Q and K) is an alias, never cached
    nq, nk = [
        NormSpec("rms", weight=(torch.randn(D, generator=g) + 1).to(dtype).to(DEVICE), eps=1e-6)
        for _ in range(2)
    ]
    cos, sin = rope_tables(S, D)

    def fresh():
        return [(torch.randn(B, S, H, D, generator=g) * 2).to(dtype).to(DEVICE) for _ in range(2)]

    try:
        for rnd in range(2):
            for fmt in (None, "int8", "fp8"):
                q, k = fresh()
                before = n[0]
                got = ditfuse.qk_norm_rope(q, k, cos, sin, q_norm=nq, k_norm=nk, quantize=fmt)
                assert (n[0] > before) == (rnd == 1)
                with monkeypatch.context() as m:
                    m.setattr(fastpath, "ENABLED", False)
                    want = ditfuse.qk_norm_rope(q, k, cos, sin, q_norm=nq, k_norm=nk, quantize=fmt)
                assert type(got) is type(want)
                for a, b in zip(got, want):
                    assert torch.equal(_bits(a), _bits(b))
        assert len(mod._CACHE) == 3
    finally:
        mod._CACHE.clear()


def _lib_inputs(dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(5)
    B, S, H, D = 1, 4, 3, 32
    q = torch.randn(B, S, H * D, generator=g).to(dtype).to(DEVICE)
    k = torch.randn(B, S, H * D, generator=g).to(dtype).to(DEVICE)
    cos, sin = rope_tables(S, D)
    w = (torch.randn(H * D, generator=g) + 1).to(dtype).to(DEVICE)
    return q, k, cos, sin, NormSpec("rms", weight=w, eps=1e-6), H


def test_opcheck_quant():
    q, k, cos, sin, norm, H = _lib_inputs()
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
    args = mod.op_args(q, k, cos, sin, **kw)
    torch.library.opcheck(torch.ops.ditfuse.qk_norm_rope_quant.default, (*args, "int8"))
    args = mod.op_args(q, None, cos, sin, **dict(kw, k_norm=None))
    torch.library.opcheck(torch.ops.ditfuse.qk_norm_rope_quant.default, (*args, "fp8"))


@pytest.mark.parametrize(
    "fmt,with_k,backend", [("int8", True, "inductor"), ("fp8", False, "aot_eager")]
)
@torch.no_grad()
def test_compile_fullgraph_matches_eager(fmt, with_k, backend):
    q, k, cos, sin, norm, H = _lib_inputs()
    k = k if with_k else None
    torch._dynamo.reset()

    def f(q, k, cos, sin):
        q = q * 1.5  # an op around the custom op
        r = ditfuse.qk_norm_rope(
            q,
            k,
            cos,
            sin,
            q_norm=norm,
            k_norm=norm if k is not None else None,
            num_heads=H,
            quantize=fmt,
        )
        return r.q, r.k, r.q_scale * 2, r.k_scale

    want = f(q, k, cos, sin)
    got = torch.compile(f, fullgraph=True, backend=backend)(q, k, cos, sin)
    for a, b in zip(got, want):
        if b is None:
            assert a is None
            continue
        assert a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("form", ["token", "flat"])
@torch.no_grad()
def test_nan_head_gets_a_nan_scale(fmt, form, poison_quant):
    """A NaN in a head's output makes that head's scale NaN, as the reference's amax does,
    so that attention on the 8-bit values is NaN where softmax attention on the 16-bit
    output is; the other heads keep their scales. The per-token kernel (no norm: y = x) and
    the flat-row kernel (Wan's norm across heads: the NaN reaches every head of its token)."""
    g = torch.Generator().manual_seed(11)
    B, S, H, D, dtype = 1, 4, 3, 32, torch.bfloat16
    if form == "token":
        q = torch.randn(B, S, H, D, generator=g).to(dtype).to(DEVICE)
        q[0, 1, 2, 5] = float("nan")
        res = ditfuse.qk_norm_rope(q, None, quantize=fmt)
        y = q
        nan_heads = torch.zeros(B, H, S, dtype=torch.bool)
        nan_heads[0, 2, 1] = True
    else:
        q, _, kw, _ = make_qk("flat", B, S, H, D, dtype, g)
        q[0, 2, 7] = float("nan")
        qn = make_norm("rms", "all", H, D, dtype, g)
        cos, sin, tkw = make_tables("S,W", B, S, H, D, "interleaved", g)
        kw.update(tkw, q_norm=qn)
        p = mod.plan(q, None, cos, sin, **kw)
        assert mod.flat_applies(p, p.q, p.k)
        res = ditfuse.qk_norm_rope(q, None, cos, sin, quantize=fmt, **kw)
        y, _ = ditfuse.qk_norm_rope(q, None, cos, sin, **kw)
        nan_heads = torch.zeros(B, H, S, dtype=torch.bool)
        nan_heads[0, :, 2] = True
    v_ref, s_ref = quantize_per_token(y, fmt, layout="bshd", num_heads=H)
    assert torch.equal(res.q_scale.isnan().cpu(), nan_heads), res.q_scale
    assert torch.equal(s_ref.isnan().cpu(), nan_heads)
    fin = ~nan_heads
    assert torch.equal(res.q_scale.cpu()[fin], s_ref.cpu()[fin])
    # the other heads' values bitwise; a NaN head's values are any (each times a NaN scale)
    fin_v = fin.transpose(1, 2)[..., None].expand(B, S, H, D)
    got = res.q.reshape(B, S, H, D).cpu()[fin_v]
    ref = v_ref.reshape(B, S, H, D).cpu()[fin_v]
    assert torch.equal(got.view(torch.uint8), ref.view(torch.uint8))
