"""ditfuse.adaln_modulate / gated_residual_adaln: fp64 reference, diffusers' own blocks,
bad input, torch.library."""

import dataclasses
import itertools

import pytest
import torch
from conftest import DEVICE, DTYPES, TOL, assert_close_report

import ditfuse
from ditfuse.reference import adaln_reference

SHAPES = [(2, 5, 64), (1, 1, 1000), (3, 4, 48), (1, 2, 9000)]  # S = 1, odd D, chunked D
MODS = ["chunk_b6d", "b1d", "per_token", "1d", "d", None]


def _mod(kind, B, S, D, dtype, g, k=0):
    """shift/scale/gate as the models build them (views of one temb, no copies)."""
    if kind is None:
        return None
    if kind == "chunk_b6d":  # Wan 2.1: (table + temb.float()).chunk(6, dim=1) -> (B, 1, D)
        return (torch.randn(B, 6, D, generator=g) * 0.3).to(dtype).to(DEVICE).chunk(6, 1)[k]
    if kind == "b1d":  # FLUX: emb.chunk(6, dim=1) of (B, 6D) -> (B, D) strided
        return (torch.randn(B, 6 * D, generator=g) * 0.3).to(dtype).to(DEVICE).chunk(6, 1)[k]
    if kind == "per_token":  # Wan 2.2 TI2V: (B, S, 6, D).chunk(6, dim=2)[i].squeeze(2)
        return (
            (torch.randn(B, S, 6, D, generator=g) * 0.3)
            .to(dtype)
            .to(DEVICE)
            .chunk(6, 2)[k]
            .squeeze(2)
        )
    if kind == "1d":
        return (torch.randn(1, D, generator=g) * 0.3).to(dtype).to(DEVICE)
    if kind == "d":
        return (torch.randn(D, generator=g) * 0.3).to(dtype).to(DEVICE)
    raise AssertionError(kind)


def _cases():
    out = []
    for i, (norm, dtype, mod) in enumerate(itertools.product(["layer", "rms", None], DTYPES, MODS)):
        shape = SHAPES[i % len(SHAPES)]
        affine = i % 3 == 0 and norm is not None
        per_op = i % 4 == 1 and dtype != torch.float32
        residual = ["none", "gated", "plain"][i % 3]
        out.append(
            pytest.param(
                norm,
                dtype,
                mod,
                shape,
                affine,
                per_op,
                residual,
                id=f"{norm}-{str(dtype)[6:]}-{mod}-{'x'.join(map(str, shape))}"
                f"{'-affine' if affine else ''}{'-per_op' if per_op else ''}-{residual}",
            )
        )
    return out


@pytest.mark.parametrize("norm,dtype,mod,shape,affine,per_op,residual", _cases())
@torch.no_grad()
def test_against_fp64_reference(norm, dtype, mod, shape, affine, per_op, residual):
    B, S, D = shape
    g = torch.Generator().manual_seed(B * 1000 + D + len(str(mod)))
    x = (torch.randn(B, S, D, generator=g) * 2 + 0.5).to(dtype).to(DEVICE)
    mdt = dtype if per_op else torch.float32
    shift = _mod(mod, B, S, D, mdt, g, 0)
    scale = _mod(mod, B, S, D, mdt, g, 1)
    gate = _mod(mod if mod else "b1d", B, S, D, mdt, g, 2) if residual == "gated" else None
    w = (torch.randn(D, generator=g) * 0.3 + 1).to(DEVICE) if affine else None
    b = (torch.randn(D, generator=g) * 0.3).to(DEVICE) if affine else None
    rounding = "per_op" if per_op else "once"
    kw = dict(norm=norm, weight=w, bias=b, eps=1e-6, rounding=rounding)
    if residual == "none":
        out = torch.full_like(x, float("nan"))  # poisoned: every element must be written
        got = ditfuse.adaln_modulate(x, shift, scale, out=out, **kw)
        assert got is out
        want = adaln_reference(x, shift, scale, compute_dtype=torch.float64, **kw)
        share = assert_close_report(got, want, dtype)
    else:
        y = torch.randn(B, S, D, generator=g).to(dtype if per_op else torch.float32).to(DEVICE)
        x0 = x.clone()
        xn, m = ditfuse.gated_residual_adaln(
            x, y, gate, shift, scale, inplace=residual == "plain", **kw
        )
        rxn, rm = adaln_reference(
            x0, shift, scale, residual=y, gate=gate, compute_dtype=torch.float64, **kw
        )
        if residual == "plain":
            assert xn.data_ptr() == x.data_ptr()
        else:
            assert torch.equal(x, x0), "x changed without inplace"
        assert_close_report(xn, rxn, dtype, "x_new")
        share = assert_close_report(m, rm, dtype, "modulated")
    if dtype != torch.float32:
        assert share >= 0.97, share


@pytest.mark.parametrize("dtype", DTYPES)
@torch.no_grad()
def test_wan_block_arithmetic(dtype):
    """WanTransformerBlock's inline chain with diffusers' FP32LayerNorm modules."""
    from diffusers.models.normalization import FP32LayerNorm

    g = torch.Generator().manual_seed(1)
    B, S, D = 1, 7, 96
    x = torch.randn(B, S, D, generator=g).to(dtype).to(DEVICE)
    attn = torch.randn(B, S, D, generator=g).to(dtype).to(DEVICE)
    table = torch.randn(1, 6, D, generator=g).to(DEVICE) / D**0.5
    temb = torch.randn(B, 6, D, generator=g).to(dtype).to(DEVICE)
    shift, scale, gate, c_shift, c_scale, c_gate = (table + temb.float()).chunk(6, dim=1)
    norm1 = FP32LayerNorm(D, 1e-6, elementwise_affine=False).to(DEVICE)
    norm2 = FP32LayerNorm(D, 1e-6, elementwise_affine=True).to(DEVICE)
    norm2.weight.normal_(1, 0.2)
    norm2.bias.normal_(0, 0.2)
    want1 = (norm1(x.float()) * (1 + scale) + shift).type_as(x)
    got1 = ditfuse.adaln_modulate(x, shift, scale, norm="layer", eps=1e-6)
    s1 = assert_close_report(got1, want1, dtype, "norm1 modulate")
    want_x = (x.float() + attn * gate).type_as(x)
    want2 = norm2(want_x.float()).type_as(x)
    got_x, got2 = ditfuse.gated_residual_adaln(
        x, attn, gate, norm="layer", weight=norm2.weight, bias=norm2.bias, eps=1e-6
    )
    assert torch.equal(got_x, want_x), "the gated residual must be bitwise Wan's"
    s2 = assert_close_report(got2, want2, dtype, "norm2")
    # FFN residual with fp32 branch output, then the next block's norm1 modulation
    ff = torch.randn(B, S, D, generator=g).to(dtype).to(DEVICE)
    want_x3 = (x.float() + ff.float() * c_gate).type_as(x)
    want3 = (norm1(want_x3.float()) * (1 + c_scale) + c_shift).type_as(x)
    got_x3, got3 = ditfuse.gated_residual_adaln(
        x, ff.float(), c_gate, c_shift, c_scale, norm="layer"
    )
    assert torch.equal(got_x3, want_x3)
    s3 = assert_close_report(got3, want3, dtype, "ffn residual + modulate")
    print(f"Wan {dtype}: bitwise share norm1 {s1:.4f} norm2 {s2:.4f} ffn+mod {s3:.4f}")
    if dtype != torch.float32:
        assert min(s1, s2, s3) >= 0.97


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@torch.no_grad()
def test_flux_adalayernormzero_per_op(dtype):
    """diffusers' AdaLayerNormZero (FLUX) run in half precision: rounding='per_op'."""
    from diffusers.models.normalization import AdaLayerNormZero

    g = torch.Generator().manual_seed(2)
    B, S, D = 2, 6, 128
    mod = AdaLayerNormZero(D).to(DEVICE, dtype)
    x = torch.randn(B, S, D, generator=g).to(dtype).to(DEVICE)
    emb = torch.randn(B, D, generator=g).to(dtype).to(DEVICE)
    want, gate_msa, shift_mlp, scale_mlp, gate_mlp = mod(x, emb=emb)
    shift, scale = mod.linear(mod.silu(emb)).chunk(6, dim=1)[:2]
    got = ditfuse.adaln_modulate(x, shift, scale, norm="layer", eps=1e-6, rounding="per_op")
    share = assert_close_report(got, want, dtype)
    # FLUX's gated residual and norm2 modulation, in the activation dtype
    attn = torch.randn(B, S, D, generator=g).to(dtype).to(DEVICE)
    want_x = x + gate_msa.unsqueeze(1) * attn
    norm2 = torch.nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)
    want_m = norm2(want_x) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
    got_x, got_m = ditfuse.gated_residual_adaln(
        x, attn, gate_msa, shift_mlp, scale_mlp, norm="layer", eps=1e-6, rounding="per_op"
    )
    assert torch.equal(got_x, want_x)
    share2 = assert_close_report(got_m, want_m, dtype)
    print(f"FLUX {dtype}: bitwise share modulate {share:.4f}, residual+modulate {share2:.4f}")
    assert min(share, share2) >= 0.97


@torch.no_grad()
def test_against_torch_norm_modules():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 9, 200, generator=g).to(DEVICE)
    ln = torch.nn.LayerNorm(200, eps=1e-5).to(DEVICE)
    ln.weight.normal_(1, 0.3)
    ln.bias.normal_(0, 0.3)
    rms = torch.nn.RMSNorm(200, eps=1e-6).to(DEVICE)
    rms.weight.normal_(1, 0.3)
    torch.testing.assert_close(
        ditfuse.adaln_modulate(x, norm="layer", weight=ln.weight, bias=ln.bias, eps=1e-5),
        ln(x),
        **TOL[torch.float32],
    )
    torch.testing.assert_close(
        ditfuse.adaln_modulate(x, norm="rms", weight=rms.weight, eps=1e-6),
        rms(x),
        **TOL[torch.float32],
    )


def _bad():
    x = torch.randn(2, 3, 16, device=DEVICE)
    v = torch.randn(2, 16, device=DEVICE)
    return [
        ("x int", lambda: ditfuse.adaln_modulate(x.int(), v, v), TypeError, "x.dtype"),
        ("x 4-D", lambda: ditfuse.adaln_modulate(x[None], v, v), ValueError, "x must be"),
        ("shift D", lambda: ditfuse.adaln_modulate(x, v[:, :8], v), ValueError, "shift"),
        (
            "scale batch",
            lambda: ditfuse.adaln_modulate(x, v, torch.randn(3, 16, device=DEVICE)),
            ValueError,
            "scale",
        ),
        ("scale int", lambda: ditfuse.adaln_modulate(x, v, v.int()), TypeError, "scale"),
        ("norm", lambda: ditfuse.adaln_modulate(x, v, v, norm="group"), ValueError, "norm"),
        (
            "rounding",
            lambda: ditfuse.adaln_modulate(x, v, v, rounding="twice"),
            ValueError,
            "rounding",
        ),
        (
            "per_op dtype",
            lambda: ditfuse.adaln_modulate(x.bfloat16(), v, v, rounding="per_op"),
            ValueError,
            "per_op",
        ),
        (
            "weight size",
            lambda: ditfuse.adaln_modulate(x, v, v, weight=torch.ones(15, device=DEVICE)),
            ValueError,
            "weight",
        ),
        (
            "weight without norm",
            lambda: ditfuse.adaln_modulate(
                x, v, v, norm=None, weight=torch.ones(16, device=DEVICE)
            ),
            ValueError,
            "weight",
        ),
        ("eps", lambda: ditfuse.adaln_modulate(x, v, v, eps=-1.0), ValueError, "eps"),
        ("y shape", lambda: ditfuse.gated_residual_adaln(x, x[:, :2], v), ValueError, "y.shape"),
        ("y missing", lambda: ditfuse.gated_residual_adaln(x, None, v), ValueError, "y"),
        (
            "gate shape",
            lambda: ditfuse.gated_residual_adaln(
                x, x.clone(), torch.randn(2, 2, 16, device=DEVICE)
            ),
            ValueError,
            "gate",
        ),
        (
            "out shape",
            lambda: ditfuse.adaln_modulate(x, v, v, out=torch.empty(2, 3, 8, device=DEVICE)),
            ValueError,
            "out",
        ),
    ]


@pytest.mark.parametrize("case", _bad(), ids=lambda c: c[0])
@torch.no_grad()
def test_bad_input(case):
    name, call, exc, text = case
    with pytest.raises(exc) as info:
        call()
    assert text in str(info.value), (name, str(info.value))


def test_opcheck_and_compile():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 3, 32, generator=g).bfloat16().to(DEVICE)
    y = torch.randn(2, 3, 32, generator=g).bfloat16().to(DEVICE)
    temb = torch.randn(2, 6, 32, generator=g).to(DEVICE)
    sh, sc, gt = temb.chunk(6, 1)[:3]
    torch.library.opcheck(
        torch.ops.ditfuse.adaln.default, (x, None, None, sh, sc, None, None, 1, 1e-6, False)
    )
    torch.library.opcheck(
        torch.ops.ditfuse.adaln.default, (x, y, gt, sh, sc, None, None, 2, 1e-6, False)
    )
    torch.library.opcheck(
        torch.ops.ditfuse.gated_residual_adaln_.default,
        (x.clone(), y, gt, sh, sc, None, None, 1, 1e-6, False),
    )

    def f(x, y, temb):
        sh, sc, gt = temb.chunk(6, 1)[:3]
        xn, m = ditfuse.gated_residual_adaln(x, y, gt, sh, sc)
        return ditfuse.adaln_modulate(xn, sh, sc) + m

    torch._dynamo.reset()
    with torch.no_grad():
        want = f(x, y, temb)
        got = torch.compile(f, fullgraph=True, backend="aot_eager")(x, y, temb)
    assert torch.equal(got, want)


@pytest.mark.parametrize("D", [64, 96, 1000, 1536, 3072, 4096, 5120, 5632, 6144, 8192])
def test_tile_settings_table(D):
    """The launch table's rule (``launch_settings``): a program holds about 4096 elements (one
    row from 3072 channels up, at most 16 rows), a thread at most 40 of a row at 4 warps, else
    8 warps (FLUX.2's 6144 channels: 79 registers at 4 warps on sm_90, 6 programs an SM; H200
    modulate 34.1 vs 37.2 us at 8 / 4 warps), and the tile (rows x padded width) covers every
    channel."""
    from ditfuse.ops import adaln

    st = adaln.launch_settings(D)
    rows, warps, a, b = st.rows, st.num_warps, st.block_a, st.block_b
    assert a + b >= D and a & (a - 1) == 0 and (b == 0 or b & (b - 1) == 0)
    assert rows & (rows - 1) == 0 and rows * (a + b) <= max(4096, a + b)
    assert rows in (1, 16) or rows * (a + b) * 2 > 4096, "fewer rows than the table's 4096 elements"
    assert warps == (4 if (a + b) / 128 <= 40 else 8)
    assert (rows, warps) == {5120: (1, 4), 6144: (1, 8), 3072: (1, 4)}.get(D, (rows, warps))


@pytest.mark.parametrize("settings,D", [((1, 4), 96), ((2, 2), 80), ((4, 8), 1000), ((16, 1), 64)])
@pytest.mark.parametrize("mod", ["chunk_b6d", "b1d", "d", "per_token", None])
def test_tile_settings_agree(monkeypatch, settings, D, mod):
    """The tile kernel under launch settings other than the table's (rows per program,
    warps): x_new bitwise, the outputs within one rounding (the row sums' order depends on
    the warps), both ops, norms layer / rms, S not a multiple of the rows, batch > 1,
    per-token modulation; and the grid is the one the settings imply."""
    from ditfuse.ops import adaln

    rows = settings[0]
    g = torch.Generator().manual_seed(rows * D)
    B, S = 2, 7
    x = torch.randn(B, S, D, generator=g).to(torch.bfloat16).to(DEVICE)
    y = torch.randn(B, S, D, generator=g).to(torch.bfloat16).to(DEVICE)
    gate, shift, scale = (_mod(mod, B, S, D, torch.float32, g, k) for k in (2, 0, 1))
    w = (torch.randn(D, generator=g) * 0.2 + 1).to(DEVICE)
    with torch.no_grad():
        want = ditfuse.gated_residual_adaln(x, y, gate, shift, scale, norm="layer")
        want_m = ditfuse.adaln_modulate(x, shift, scale, norm="rms", weight=w)
        grids, real = [], adaln._adaln_tile_kernel

        class Spy:
            def __getitem__(self, grid):
                grids.append(grid)
                return real[grid]

        monkeypatch.setattr(adaln, "_adaln_tile_kernel", Spy())
        st = dataclasses.replace(adaln.launch_settings(D), rows=rows, num_warps=settings[1])
        o = adaln.AdaLNOptions
        got = adaln._run(x, y, gate, shift, scale, o("layer"), settings=st)
        got_m = adaln._run(x, None, None, shift, scale, o("rms", w), settings=st)[1]
    assert grids == [(-(-S // rows), B)] * 2
    assert torch.equal(got[0], want[0])
    for a, b in ((got[1], want[1]), (got_m, want_m)):
        share = assert_close_report(a, b, torch.bfloat16, "settings vs table")
        assert share > 0.95, share


@pytest.mark.parametrize("D", [5120, 1000, 9000])  # Wan; odd; the one-row kernel's chunks
@pytest.mark.parametrize("mod", ["chunk_b6d", "per_token", "b1d", None])
@pytest.mark.parametrize("dtype", DTYPES)
@torch.no_grad()
def test_gated_residual_is_the_eager_chain(D, mod, dtype):
    """gated_residual: bitwise Wan's ``(x.float() + ff.float() * c_gate).type_as(x)`` (and
    ``x + y`` without a gate), every element written (poisoned out), in place via out=x."""
    g = torch.Generator().manual_seed(D + len(str(mod)))
    B, S = 2, 3
    x = (torch.randn(B, S, D, generator=g) * 2).to(dtype).to(DEVICE)
    y = torch.randn(B, S, D, generator=g).to(dtype).to(DEVICE)
    gate = _mod(mod, B, S, D, torch.float32, g, 5)
    gb = gate.unsqueeze(1) if gate is not None and gate.dim() == 2 else gate  # FLUX's (B, D)
    want = (
        (x.float() + y.float() * gb).type_as(x)
        if gate is not None
        else (x.float() + y.float()).type_as(x)
    )
    out = torch.full_like(x, float("nan"))
    assert ditfuse.gated_residual(x, y, gate, out=out) is out
    assert torch.equal(out, want)
    x2 = x.clone()
    ditfuse.gated_residual(x2, y, gate, out=x2)
    assert torch.equal(x2, want)


@torch.no_grad()
def test_gated_residual_per_op_is_fluxs_chain():
    """rounding="per_op": FLUX's bf16 ``x + gate.unsqueeze(1) * ff`` bitwise."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 9, 3072, generator=g).to(torch.bfloat16).to(DEVICE)
    ff = torch.randn(2, 9, 3072, generator=g).to(torch.bfloat16).to(DEVICE)
    gate = (
        (torch.randn(2, 6 * 3072, generator=g) * 0.3).to(torch.bfloat16).to(DEVICE).chunk(6, 1)[5]
    )
    want = x + gate.unsqueeze(1) * ff
    assert torch.equal(ditfuse.gated_residual(x, ff, gate, rounding="per_op"), want)


def test_gated_residual_bad_input_and_compile():
    x = torch.randn(1, 4, 64).to(DEVICE)
    with pytest.raises(ValueError, match="y.shape"):
        ditfuse.gated_residual(x, torch.randn(1, 4, 32).to(DEVICE))
    with pytest.raises(ValueError, match="gate has shape"):
        ditfuse.gated_residual(x, x, torch.randn(3, 64).to(DEVICE))
    with pytest.raises(ValueError, match="per_op"):
        ditfuse.gated_residual(
            x.bfloat16(), x.bfloat16(), torch.randn(1, 64).to(DEVICE), rounding="per_op"
        )
    y, gate = torch.randn(1, 4, 64).to(DEVICE), torch.randn(1, 6, 64).to(DEVICE).chunk(6, 1)[2]
    torch.library.opcheck(torch.ops.ditfuse.gated_residual.default, (x, y, gate, False))
    torch._dynamo.reset()
    with torch.no_grad():
        want = ditfuse.gated_residual(x, y, gate)
        got = torch.compile(
            lambda a, b, c: ditfuse.gated_residual(a, b, c), fullgraph=True, backend="aot_eager"
        )(x, y, gate)
    assert torch.equal(got, want)


@pytest.mark.parametrize("D", [1, 3, 7, 33, 4097])
@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
@torch.no_grad()
def test_tile_kernel_odd_widths_and_strides(D, layout):
    """Rows of 1, 3, 7, 33 and 4097 channels (pieces 1+0, 2+1, 4+4, 32+1, 4096+1), S = 1 and
    S = 5, x / y as transposed or sliced views (no copy, element stride != 1): the norms
    within the contract of the fp64 reference, the residuals bitwise the fp32 eager chain,
    every element written."""
    g = torch.Generator().manual_seed(D)
    for S in (1, 5):

        def make():
            if layout == "transposed":  # (B, S, D) view of a (B, D, S) buffer: stride_d = S
                return (
                    torch.randn(2, D, S, generator=g).to(torch.bfloat16).to(DEVICE).transpose(1, 2)
                )
            if layout == "sliced":  # every other channel of a wider row
                return torch.randn(2, S, 2 * D, generator=g).to(torch.bfloat16).to(DEVICE)[..., ::2]
            return torch.randn(2, S, D, generator=g).to(torch.bfloat16).to(DEVICE)

        x, y = make(), make()
        shift, scale, gate = (torch.randn(2, 6, D, generator=g) * 0.3).to(DEVICE).chunk(6, 1)[:3]
        out = torch.full(x.shape, float("nan"), dtype=x.dtype, device=DEVICE)
        m = ditfuse.adaln_modulate(x, shift, scale, out=out)
        assert_close_report(
            m,
            adaln_reference(x, shift, scale, compute_dtype=torch.float64),
            torch.bfloat16,
            "modulate",
        )
        xn, m2 = ditfuse.gated_residual_adaln(x, y, gate, shift, scale, norm="rms")
        _, rm2 = adaln_reference(
            x, shift, scale, norm="rms", residual=y, gate=gate, compute_dtype=torch.float64
        )
        eager_x = (x.float() + y.float() * gate).to(torch.bfloat16)  # fp32 math, one rounding
        assert torch.equal(xn, eager_x)
        assert_close_report(m2, rm2, torch.bfloat16, "gated")
        assert torch.equal(ditfuse.gated_residual(x, y, gate), eager_x)


@pytest.mark.parametrize("B,S", [(2, 2), (3, 5)])
@torch.no_grad()
def test_reference_and_fallback_read_2d_operands_per_batch(B, S, monkeypatch):
    """A (B, D) shift / scale / gate is one row per batch entry in the reference and in the
    fallback that runs it off the GPU, as in the kernel: the same result as its (B, 1, D)
    view, also when B == S (where plain broadcasting would apply it per token)."""
    from ditfuse.runtime import backend as _runtime

    g = torch.Generator().manual_seed(B * 10 + S)
    D = 16
    x = torch.randn(B, S, D, generator=g).to(DEVICE)
    y = torch.randn(B, S, D, generator=g).to(DEVICE)
    shift, scale, gate = (torch.randn(B, 6 * D, generator=g) * 0.3).to(DEVICE).chunk(6, 1)[:3]
    want = adaln_reference(x, shift[:, None], scale[:, None], compute_dtype=torch.float64)
    assert torch.equal(adaln_reference(x, shift, scale, compute_dtype=torch.float64), want)
    wxn, wm = adaln_reference(x, shift[:, None], scale[:, None], residual=y, gate=gate[:, None])
    kernel = ditfuse.adaln_modulate(x, shift, scale)
    monkeypatch.setattr(_runtime, "kernel_device_ok", lambda *a: False)
    fallback = ditfuse.adaln_modulate(x, shift, scale)
    xn, m = ditfuse.gated_residual_adaln(x, y, gate, shift, scale)
    assert_close_report(fallback, want, torch.float32, "fallback")
    assert_close_report(kernel, want, torch.float32, "kernel")
    assert torch.equal(xn, wxn) and torch.equal(m, wm)


@pytest.mark.parametrize(
    "case",
    [
        "wan",
        "odd-d",
        "per-token",
        "s1",
        "batch-view",
        "y-fp32",
        "no-gate",
        "per-op",
        "strided-x",
        "off64",
    ],
)
@torch.no_grad()
def test_gated_residual_flat_kernel_is_the_tile_kernel(case, monkeypatch):
    """The gated residual on dense rows runs the flat kernel (``_residual_flat_kernel``);
    its output is bitwise the eager chain's and the tile kernel's (``flat=False``: the
    kernel of the ahead-of-time package), every element written, in place too; rows that
    are not dense keep the tile kernel."""
    from ditfuse.ops import adaln as A
    from ditfuse.runtime import fastpath as _fastpath

    monkeypatch.setattr(_fastpath, "ENABLED", False)  # no replay of an earlier test's launch
    g = torch.Generator().manual_seed(len(case))
    dt = torch.bfloat16
    B, S, D = {
        "wan": (1, 5, 640),
        "odd-d": (2, 3, 1000),
        "per-token": (2, 4, 96),
        "s1": (3, 1, 72),
        "batch-view": (2, 3, 256),
        "y-fp32": (1, 7, 48),
        "no-gate": (2, 2, 80),
        "per-op": (2, 9, 192),
        "strided-x": (2, 3, 64),
        "off64": (2, 5, 100),
    }[case]
    x = (torch.randn(B, S, D, generator=g) * 2).to(dt)
    y = torch.randn(B, S, D, generator=g).to(torch.float32 if case == "y-fp32" else dt)
    gate = torch.randn(B, 6 * D, generator=g).chunk(6, 1)[4]  # FLUX / Wan: a strided chunk
    if case == "per-token":
        gate = torch.randn(B, S, 6 * D, generator=g).chunk(6, -1)[1]
    if case == "per-op":
        gate = gate.to(dt)
    if case == "no-gate":
        gate = None
    # views taken on the device (moving a view that is not dense makes it contiguous)
    if case == "batch-view":  # every other entry of a larger batch: a batch stride of 2 S D
        x = (torch.randn(2 * B, S, D, generator=g) * 2).to(dt).to(DEVICE)[::2]
        y = torch.randn(2 * B, S, D, generator=g).to(dt).to(DEVICE)[::2]
        assert x.stride(0) == 2 * S * D
    if case == "strided-x":  # rows not dense: the tile kernel
        x = (torch.randn(B, S, 2 * D, generator=g) * 2).to(dt).to(DEVICE)[..., ::2]
        assert x.stride(2) == 2
    if case == "off64":
        monkeypatch.setattr(A, "OFF64_AT", 0)
    x, y = x.to(DEVICE), y.to(DEVICE)
    gate = gate.to(DEVICE) if gate is not None else None
    per_op = "per_op" if case == "per-op" else "once"
    gb = gate.unsqueeze(1) if gate is not None and gate.dim() == 2 else gate
    if gate is None:
        want = (x.float() + y.float()).type_as(x)
    elif per_op == "per_op":
        want = x + gb * y
    else:
        want = (x.float() + y.float() * gb).type_as(x)

    launched = []
    orig = A._launch_residual_flat
    monkeypatch.setattr(A, "_launch_residual_flat", lambda *a: (launched.append(1), orig(*a)))
    out = torch.full_like(x, float("nan"))
    A.gated_residual(x, y, gate, rounding=per_op, out=out)
    assert bool(launched) == (case != "strided-x")
    assert torch.equal(out, want)
    tile = torch.full_like(x, float("nan"))
    launched.clear()
    o = A._residual_options(per_op)
    A._run(x, y, gate, None, None, o, out=tile, modulated=False, flat=False)
    assert not launched
    assert torch.equal(tile, out)
    x2 = x.clone()
    A.gated_residual(x2, y, gate, rounding=per_op, out=x2)
    assert torch.equal(x2, want)


@pytest.mark.parametrize("op", ["modulate", "gated", "residual", "residual-strided"])
@torch.no_grad()
def test_many_batch_entries_put_the_batch_on_the_grids_first_axis(op, monkeypatch):
    """A (tokens, D) input is tokens batch entries of one row: past the grid's second axis
    (65535; lowered to 4 here) the batch moves to the first axis (``BATCH_X``), with the
    same bits as the usual grid; both axes past it is a clear error before any launch."""
    from ditfuse.ops import adaln as A
    from ditfuse.runtime import fastpath as _fastpath

    monkeypatch.setattr(_fastpath, "ENABLED", False)
    g = torch.Generator().manual_seed(11)
    N, D = 9, 96
    x = (torch.randn(N, D, generator=g) * 2).to(torch.bfloat16).to(DEVICE)
    y = torch.randn(N, D, generator=g).to(torch.bfloat16).to(DEVICE)
    temb = torch.randn(N, 6 * D, generator=g).to(DEVICE)
    shift, scale, gate = temb.chunk(6, 1)[:3]
    if op == "residual-strided":  # rows not dense: the tile kernel
        x = (torch.randn(N, 2 * D, generator=g) * 2).to(torch.bfloat16).to(DEVICE)[:, ::2]

    def call():
        if op == "modulate":
            return A.adaln_modulate(x, shift, scale)
        if op == "gated":
            return torch.cat(A.gated_residual_adaln(x, y, gate, shift, scale), -1)
        return A.gated_residual(x, y, gate)

    want = call()
    grids = []
    for name in ("_adaln_tile_kernel", "_residual_flat_kernel"):
        real = getattr(A, name)

        class Spy:
            def __getitem__(self, grid, real=real):
                grids.append(grid)
                return real[grid]

        monkeypatch.setattr(A, name, Spy())
    monkeypatch.setattr(A, "GRID_Y_MAX", 4)
    got = call()
    assert grids and all(gr[0] == N and gr[1] <= 4 for gr in grids), grids
    assert torch.equal(got, want)
    monkeypatch.setattr(A, "GRID_Y_MAX", 0)  # neither axis can take it
    with pytest.raises(ValueError, match="batch entries"):
        call()
