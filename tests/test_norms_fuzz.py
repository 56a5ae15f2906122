"""GroupNorm + SiLU, the channel RMS + SiLU, the AdaLN ops and SwiGLU / GELU over randomly
drawn combinations of what the parametrised tests hold apart: group counts and channels a group,
spatial ranks 1-3 with sizes from 1, channels-last and sliced views of x, both GroupNorm
paths (forced split tiles at these sizes), affine or not, SiLU on or off, outputs into
poisoned buffers; for AdaLN odd widths, S = 1, strided x, every shift / scale / gate form
(chunked temb views, per token, broadcast), both rounding modes, in place or not. Each case
within its op's contract of the float64 reference. ``DITFUSE_FUZZ_N`` cases per op family
(default 24), reproducible from the case number.
"""

import os
import random

import pytest
import torch
from conftest import DEVICE, DTYPES, assert_close_report, fuzz_cases
from test_adaln import _mod
from test_group_norm import SPLIT, SPLIT_LOOP, within

from ditfuse import adaln_modulate, gated_residual_adaln
from ditfuse.ops import group_norm as gn
from ditfuse.reference import adaln_reference
from ditfuse.reference import group_norm_silu_chain as gn_chain
from ditfuse.reference import rms_norm_silu_channels_chain as rms_chain

N_CASES = int(os.environ.get("DITFUSE_FUZZ_N", "24"))
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")


def _x(r, g, N, C, spatial, dtype):
    """x of (N, C, *spatial) in a drawn layout: contiguous, channels-last, a channel slice
    of a wider tensor, or a batch slice."""
    layout = r.choice(["contiguous", "channels_last", "channel_slice", "batch_slice"])
    if layout == "channels_last" and len(spatial) == 2:
        t = torch.randn(N, *spatial, C, generator=g).permute(0, 3, 1, 2)
    elif layout == "channel_slice":
        t = torch.randn(N, C + 3, *spatial, generator=g)[:, 2 : C + 2]
    elif layout == "batch_slice":
        t = torch.randn(N + 1, C, *spatial, generator=g)[1:]
    else:
        t = torch.randn(N, C, *spatial, generator=g)
    x = (t * 2 + 0.5).to(dtype)
    x = x.to(DEVICE) if DEVICE != "cpu" else x
    return x, layout


@pytest.mark.parametrize("i", fuzz_cases(N_CASES))
@torch.no_grad()
def test_group_norm_fuzz(i):
    r = random.Random(7000 + i)
    g = torch.Generator().manual_seed(r.randrange(2**31))
    dtype = r.choice(DTYPES)
    G = r.choice([1, 2, 3, 4, 8, 32])
    C = G * r.choice([1, 2, 3, 5])
    spatial = tuple(r.choice([1, 2, 3, 5, 8, 9]) for _ in range(r.choice([1, 2, 2, 3])))
    N = r.choice([1, 2, 3])
    x, layout = _x(r, g, N, C, spatial, dtype)
    affine = r.random() < 0.7
    w = (torch.randn(C, generator=g) * 0.5 + 1).to(dtype).to(DEVICE) if affine else None
    b = (torch.randn(C, generator=g) * 0.2).to(dtype).to(DEVICE) if affine else None
    silu = r.random() < 0.8
    launch = r.choice([None, SPLIT, SPLIT_LOOP])
    out = (
        torch.full(x.shape, float("nan"), dtype=dtype, device=DEVICE) if r.random() < 0.5 else None
    )
    what = f"case{i} G{G} C{C} N{N} {spatial} {layout} {dtype} affine={affine} silu={silu} {launch}"
    x0 = x.clone()
    y = gn.group_norm_silu(x, G, w, b, 1e-6, silu=silu, out=out, _launch=launch)
    assert torch.equal(x, x0), what
    if out is not None:
        assert y is out, what
    within(y, gn_chain(x, G, w, b, 1e-6, silu=silu), what)


@pytest.mark.parametrize("i", fuzz_cases(N_CASES))
@torch.no_grad()
def test_rms_channels_fuzz(i):
    r = random.Random(8000 + i)
    g = torch.Generator().manual_seed(r.randrange(2**31))
    dtype = r.choice(DTYPES)
    C = r.choice([1, 3, 12, 20, 96, 160])
    spatial = tuple(r.choice([1, 2, 3, 5, 8]) for _ in range(r.choice([1, 2, 3])))
    N = r.choice([1, 2])
    x, layout = _x(r, g, N, C, spatial, dtype)
    pshape = (C,) + (1,) * len(spatial)
    gamma = (torch.randn(pshape, generator=g) * 0.5 + 1).to(dtype).to(DEVICE)
    bias = (
        (torch.randn(pshape, generator=g) * 0.2).to(dtype).to(DEVICE) if r.random() < 0.6 else None
    )
    scale = r.choice([None, 2.0])
    silu = r.random() < 0.8
    what = f"case{i} C{C} N{N} {spatial} {layout} {dtype} bias={bias is not None} {scale} {silu}"
    y = gn.rms_norm_silu_channels(x, gamma, bias, scale=scale, silu=silu)
    within(y, rms_chain(x, gamma, bias, scale=scale, silu=silu), what)


@pytest.mark.parametrize("i", fuzz_cases(N_CASES))
@torch.no_grad()
def test_adaln_fuzz(i):
    r = random.Random(9000 + i)
    g = torch.Generator().manual_seed(r.randrange(2**31))
    dtype = r.choice(DTYPES)
    B, S, D = r.choice([1, 2, 3]), r.choice([1, 2, 7, 33]), r.choice([1, 7, 48, 64, 1000, 3072])
    per_op = dtype != torch.float32 and r.random() < 0.3
    mdt = dtype if per_op else r.choice([torch.float32, dtype])
    mod = r.choice(["chunk_b6d", "b1d", "per_token", "1d", "d", None])
    layout = r.choice(["contiguous", "sliced", "transposed"])

    def act():
        if layout == "sliced":
            t = torch.randn(B, S, 2 * D, generator=g)[..., ::2]
        elif layout == "transposed":
            t = torch.randn(B, D, S, generator=g).transpose(1, 2)
        else:
            t = torch.randn(B, S, D, generator=g)
        return (t * 2 + 0.5).to(dtype).to(DEVICE)

    x = act()
    shift, scale = _mod(mod, B, S, D, mdt, g, 0), _mod(mod, B, S, D, mdt, g, 1)
    norm = r.choice(["layer", "rms", None])
    affine = norm is not None and r.random() < 0.4
    w = (torch.randn(D, generator=g) * 0.3 + 1).to(DEVICE) if affine else None
    b = (torch.randn(D, generator=g) * 0.3).to(DEVICE) if affine and norm == "layer" else None
    kw = dict(norm=norm, weight=w, bias=b, eps=1e-6, rounding="per_op" if per_op else "once")
    what = (
        f"case{i} B{B} S{S} D{D} {dtype} {mod} {mdt} {layout} {kw['norm']} "
        f"affine={affine} {kw['rounding']}"
    )
    if r.random() < 0.5:
        got = adaln_modulate(x, shift, scale, **kw)
        want = adaln_reference(x, shift, scale, compute_dtype=torch.float64, **kw)
        assert_close_report(got, want, dtype, what)
        return
    y = act() if per_op else act().float()
    gate = (
        _mod(r.choice(["chunk_b6d", "b1d", "per_token", "1d"]), B, S, D, mdt, g, 2)
        if r.random() < 0.7
        else None
    )
    inplace = r.random() < 0.4
    x0 = x.clone()
    xn, m = gated_residual_adaln(x, y, gate, shift, scale, inplace=inplace, **kw)
    rxn, rm = adaln_reference(
        x0, shift, scale, residual=y, gate=gate, compute_dtype=torch.float64, **kw
    )
    if inplace:
        assert xn.data_ptr() == x.data_ptr(), what
    else:
        assert torch.equal(x, x0), what
    assert_close_report(xn, rxn, dtype, "x_new " + what)
    assert_close_report(m, rm, dtype, "modulated " + what)


@pytest.mark.parametrize("i", fuzz_cases(N_CASES))
@torch.no_grad()
def test_activations_fuzz(i):
    """SwiGLU / GELU (tanh, erf) over ranks 1-4, odd widths, column slices of a wider
    projection, out= into a column slice of a NaN-filled buffer (FLUX's concat buffer):
    within the fp64 bounds of test_activations.py, every element written."""
    from test_activations import assert_gelu_bound, assert_swiglu_bound

    from ditfuse import gelu, swiglu

    r = random.Random(10000 + i)
    g = torch.Generator().manual_seed(r.randrange(2**31))
    dtype = r.choice(DTYPES)
    op = r.choice(["swiglu", "gelu-tanh", "gelu-none"])
    lead = tuple(r.choice([1, 2, 3, 5]) for _ in range(r.choice([0, 1, 2, 3])))
    W = r.choice([2, 6, 34, 130, 4098]) if op == "swiglu" else r.choice([1, 5, 33, 129, 4097])
    off = r.choice([0, 0, 3, 16])
    t = torch.randn(*lead, off + W + r.choice([0, 5]), generator=g, dtype=torch.float64) * 3
    t = torch.where(t.abs() < 1e-3, torch.full_like(t, 1e-3), t)
    x = t.to(dtype).to(DEVICE)[..., off : off + W]  # a column slice, as FLUX's MLP input
    N = W // 2 if op == "swiglu" else W
    out = None
    if r.random() < 0.5:  # into the columns after D of a concat buffer, NaN first
        D = r.choice([1, 7, 64])
        buf = torch.full(lead + (D + N,), float("nan"), dtype=dtype, device=DEVICE)
        out = buf[..., D:]
    what = f"case{i} {op} {lead} W{W} off{off} {dtype} out={out is not None}"
    x0 = x.clone()
    if op == "swiglu":
        y = swiglu(x, out=out)
        assert_swiglu_bound(y, x)
    else:
        approx = "tanh" if op == "gelu-tanh" else "none"
        y = gelu(x, approx, out=out)
        assert_gelu_bound(y, x, approx)
    assert torch.equal(x, x0), what
    if out is not None:
        assert y.data_ptr() == out.data_ptr(), what
        assert torch.isnan(buf[..., :D]).all(), f"{what}: wrote outside out"
