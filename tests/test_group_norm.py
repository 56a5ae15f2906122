"""group_norm_silu / rms_norm_silu_channels: fp64 reference on both paths, torch's GroupNorm
and diffusers' WanRMS_norm, strided views, poisoned outputs, bad input, torch.library; the
numerical contract itself (an intermediate rounding amplified by SiLU, wrong outputs caught)."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE, DTYPES

import ditfuse  # noqa: F401  (sets up the interpreter)
from ditfuse.ops import group_norm as gn
from ditfuse.reference import group_norm_silu_chain as gn_chain
from ditfuse.reference import rms_norm_silu_channels_chain as rms_chain
from ditfuse.tools import check_group_norm
from ditfuse.tools import gn_contract as gc
from ditfuse.tools.shapes import GN_SHAPES

# SiLU of a very negative fp32 value: exp(-y) overflows to inf and y / inf = -0, as in
# PyTorch; numpy (the interpreter) warns about it
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

# Launch-table overrides that force each path at small shapes:
FIT = None  # the default table: these groups fit
SPLIT = dict(fit_max=0, tile=16)  # split: 16-element tiles, one partial a tile
SPLIT_LOOP = dict(fit_max=0, tile=16, max_partials=3)  # several tiles a statistics program,
# masked tail tiles past the group's end
PATHS = {"fit": FIT, "split": SPLIT, "split-loop": SPLIT_LOOP}

SHARES = {}  # bitwise shares seen, printed at the end (pytest -s)


def _rand(shape, dtype, seed, scale=2.0, shift=0.5):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale + shift).to(dtype).to(DEVICE)


def _params(C, dtype, seed, shape=None):
    shape = shape or (C,)
    return _rand(shape, dtype, seed + 1, 0.5, 1.0), _rand(shape, dtype, seed + 2, 0.2, 0.0)


def within(out, chain, what="", against=None, extra=(), sides=1):
    """``out`` within the op's numerical contract (``gc.parity``, the helper ``ditfuse check``
    uses): every element within ``gc.contract_tolerance`` of the fp64 reference ``chain``
    (``reference.*_chain``, rounding where the kernel rounds) and, in half precision, at most
    ``gc.differ_limit`` of them differing from it. ``against``: compare with another
    implementation that rounds at the same points instead (``sides=2``: it computes in fp32
    too; ``extra``: roundings only it makes, then no share limit). Returns the bitwise-equal
    share."""
    against = chain.out if against is None else against
    p = gc.parity(out, against, chain, extra, sides=sides, gate_differ=not extra)
    assert p.ok, f"{what}: {p.describe()}; {p.n_differ} of {p.numel} differ (allowed {p.allowed})"
    return p.bitwise


def _note(key, share):
    SHARES[key] = min(share, SHARES.get(key, 1.0))


def _path_of(x, G, launch):
    N, C = x.shape[:2]
    return gn.gn_settings(N, G, C // G, math.prod(x.shape[2:]), **(launch or {})).path


# ---------------------------------------------------------------------------------------
# against the fp64 reference: within the contract (gc.contract_tolerance, gc.differ_limit)

GN_CASES = [  # (name, shape, groups)
    ("4d G32 cpg2", (2, 64, 3, 5), 32),
    ("5d G32 cpg3", (1, 96, 2, 3, 4), 32),
    ("odd cpg5", (2, 15, 4, 5), 3),
    ("G1", (1, 6, 5, 3), 1),
    ("cpg1", (1, 4, 7, 5), 4),
    ("rank3", (2, 12, 10), 4),
    ("rank6", (1, 8, 2, 2, 3, 2), 2),
]
SPLIT_CASES = [  # small group counts: the split path launches a program a tile
    ("4d odd cpg3 N2", (2, 6, 5, 7), 2),
    ("5d cpg5", (1, 10, 2, 3, 5), 2),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("case", GN_CASES, ids=lambda c: c[0])
@torch.no_grad()
def test_fit_path_vs_fp64(case, affine, dtype):
    name, shape, G = case
    x = _rand(shape, dtype, 1)
    w, b = _params(shape[1], dtype, 1) if affine else (None, None)
    assert _path_of(x, G, FIT) == "fit"
    y = gn.group_norm_silu(x, G, w, b, 1e-6)
    _note(f"gn fit vs fp64 {dtype}", within(y, gn_chain(x, G, w, b, 1e-6), name))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("path", ["split", "split-loop"])
@pytest.mark.parametrize("case", SPLIT_CASES, ids=lambda c: c[0])
@torch.no_grad()
def test_split_path_vs_fp64(case, path, dtype):
    name, shape, G = case
    x = _rand(shape, dtype, 2)
    w, b = _params(shape[1], dtype, 2)
    launch = PATHS[path]
    st = gn.gn_settings(shape[0], G, shape[1] // G, math.prod(shape[2:]), **launch)
    assert st.path == "split" and st.T > 1
    if path == "split-loop":
        assert st.TPP > 1 and st.P * st.TPP > st.T  # tiles past the end are masked
    y = gn.group_norm_silu(x, G, w, b, 1e-6, _launch=launch)
    _note(f"gn split vs fp64 {dtype}", within(y, gn_chain(x, G, w, b, 1e-6), f"{name} {path}"))


@pytest.mark.parametrize(
    "case",
    [
        ((2, 8, 4, 8), 4, {}),
        ((2, 8, 4, 8), 4, dict(max_partials=2)),
        ((1, 4, 6, 8), 4, dict(max_partials=2)),
    ],
    ids=["even", "even-loop", "even-tiles-masked-tail"],
)
@torch.no_grad()
def test_split_path_whole_tiles_vs_fp64(case):
    """Whole tiles (BC | C/G, BS | spatial) skip their masks, the statistics pass too when
    its programs' tiles all lie in the group (a program's tiles past the group's end keep
    the statistics masked): within the contract of the fp64 reference."""
    shape, G, extra = case
    launch = dict(SPLIT, **extra)
    st = gn.gn_settings(shape[0], G, shape[1] // G, math.prod(shape[2:]), **launch)
    assert (shape[1] // G) % st.BC == 0 and math.prod(shape[2:]) % st.BS == 0
    x = _rand(shape, torch.float16, 32)
    w, b = _params(shape[1], torch.float16, 32)
    y = gn.group_norm_silu(x, G, w, b, _launch=launch)
    within(y, gn_chain(x, G, w, b), str(case))


# channels-last x: the "split-cl" kernels (tiles of several groups' channel lanes x positions,
# a merge program a group)
CL_LAUNCHES = {
    "cl": dict(fit_max=0, tile=64),  # the groups side by side in one tile
    # several group blocks, statistics programs of several tiles (rounded up to a power of
    # two: programs' tiles past the end), a masked tail tile
    "cl-blocks-loop": dict(fit_max=0, tile=32, cl_lanes=8, cl_stats_programs=8, cl_tpp_pow2=True),
}
CL_CASES = [  # (name, shape, groups)
    ("4d cpg2 N2", (2, 64, 5, 7), 32),
    ("5d cpg4", (1, 32, 3, 4, 5), 8),
    ("odd cpg5 G3 N2", (2, 15, 4, 5), 3),  # lanes past a group's channels masked
    ("G6 cpg4", (1, 24, 6, 6), 6),  # lanes of groups past G masked
    ("G1 cpg16", (1, 16, 5, 9), 1),
]


def _cl(x):
    return x.contiguous(
        memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d
    )


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("launch", list(CL_LAUNCHES))
@pytest.mark.parametrize("case", CL_CASES, ids=lambda c: c[0])
@torch.no_grad()
def test_channels_last_split_vs_fp64(case, launch, dtype):
    name, shape, G = case
    x = _rand(shape, dtype, 40)
    xl = _cl(x)
    w, b = _params(shape[1], dtype, 40)
    L = CL_LAUNCHES[launch]
    st = gn.gn_settings(shape[0], G, shape[1] // G, math.prod(shape[2:]), c_inner=True, **L)
    assert st.path == "split-cl"
    if launch == "cl-blocks-loop":
        assert math.ceil(G / st.GB) > 1 or st.GB * st.CPP > 8
        assert st.TPP > 1 and st.P * st.TPP > st.n_ts  # tiles past the end are masked
    y = gn.group_norm_silu(xl, G, w, b, 1e-6, _launch=L)
    assert y.stride() == xl.stride()
    _note(
        f"gn channels-last vs fp64 {dtype}",
        within(y, gn_chain(x, G, w, b, 1e-6), f"{name} {launch}"),
    )
    yn = gn.group_norm_silu(xl, G, None, None, 1e-6, silu=False, _launch=L)
    within(yn, gn_chain(x, G, None, None, 1e-6, silu=False), f"{name} {launch} plain")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
@torch.no_grad()
def test_statistics_tile_counts_not_powers_of_two(layout, dtype):
    """Statistics programs of 3 / 5 tiles (``cl_tpp_pow2=False``: the channels-last default),
    the last program's tiles partly past the group's end."""
    if layout == "channels_last":
        shape, G = (2, 16, 5, 10), 4
        L = dict(fit_max=0, tile=32, cl_lanes=8, cl_stats_programs=20, cl_tpp_pow2=False)
        want, path = 3, "split-cl"
    else:
        shape, G = (2, 8, 9, 9), 2
        L = dict(fit_max=0, tile=16, stats_programs=20, tpp_pow2=False)
        want, path = 5, "split"
    x = _rand(shape, dtype, 43)
    xl = _cl(x) if layout == "channels_last" else x
    w, b = _params(shape[1], dtype, 43)
    st = gn.gn_settings(
        shape[0], G, shape[1] // G, math.prod(shape[2:]), c_inner=layout == "channels_last", **L
    )
    tiles = st.n_ts if path == "split-cl" else st.T
    assert st.path == path and st.TPP == want and st.P * st.TPP > tiles, st
    y = gn.group_norm_silu(xl, G, w, b, 1e-6, _launch=L)
    within(y, gn_chain(x, G, w, b, 1e-6), f"{layout} TPP {st.TPP}")


def test_channels_last_table_defaults():
    """The channels-last path's own table: 256 statistics programs in all, tile counts not
    rounded (hunyuan-vae-up-9f: 9 tiles a program, 128 programs a group block)."""
    st = gn.gn_settings(1, 32, 4, 9 * 128 * 128, c_inner=True)
    assert st.path == "split-cl" and (st.TPP, st.P, st.GB) == (9, 128, 16)
    assert st.P * math.ceil(32 / st.GB) == gn.GN_TABLE.cl_stats_programs
    cf = gn.gn_settings(1, 32, 4, 9 * 128 * 128)  # channels-first keeps power-of-two counts
    assert cf.path == "split" and (cf.TPP, cf.P) == (4, 18)


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(1, 64, 8, 8), (2, 32, 2, 4, 8)], ids=["4d", "5d"])
@torch.no_grad()
def test_channels_last_whole_tiles_and_int64_offsets(shape, monkeypatch):
    """Whole channels-last tiles (C / G a power of two, GB | G, BS | positions) skip their
    masks, and offsets inside a tile are int32 from its int64 corner: the same bits as
    int64 offsets (past ``OFF32_LIMIT``), within the contract of the fp64 reference."""
    G = shape[1] // 4
    L = dict(fit_max=0, tile=64)
    st = gn.gn_settings(shape[0], G, 4, math.prod(shape[2:]), c_inner=True, **L)
    assert st.path == "split-cl" and G % st.GB == 0 and math.prod(shape[2:]) % st.BS == 0
    x = _cl(_rand(shape, torch.bfloat16, 41))
    w, b = _params(shape[1], torch.bfloat16, 41)
    y = gn.group_norm_silu(x, G, w, b, _launch=L)
    monkeypatch.setattr(gn, "OFF32_LIMIT", 0)
    assert torch.equal(y, gn.group_norm_silu(x, G, w, b, _launch=L))
    within(y, gn_chain(x.contiguous(), G, w, b), str(shape))


@torch.no_grad()
def test_channels_last_out_layouts_and_in_place():
    """A channels-last x into a contiguous out= (y's strides differ from x's), into a channel
    slice of a channels-last buffer, and in place."""
    x = _cl(_rand((2, 16, 5, 6), torch.bfloat16, 42))
    w, b = _params(16, torch.bfloat16, 42)
    L = CL_LAUNCHES["cl"]
    ref = gn_chain(x.contiguous(), 4, w, b)
    out = torch.full(x.shape, float("nan"), dtype=x.dtype, device=DEVICE)
    assert gn.group_norm_silu(x, 4, w, b, out=out, _launch=L) is out
    within(out, ref, "contiguous out")
    buf = _cl(torch.full((2, 24, 5, 6), float("nan"), dtype=x.dtype, device=DEVICE))
    gn.group_norm_silu(x, 4, w, b, out=buf[:, 4:20], _launch=L)
    within(buf[:, 4:20], ref, "channel slice of a channels-last buffer")
    assert torch.isnan(buf[:, :4]).all() and torch.isnan(buf[:, 20:]).all()
    xi = x.clone()
    assert gn.group_norm_silu(xi, 4, w, b, out=xi, _launch=L) is xi
    within(xi, ref, "in place")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@torch.no_grad()
def test_channels_last_large_offset_statistics(dtype):
    off, spread = (1e5, 1.0) if dtype == torch.float32 else (300.0, 8.0)
    x = _rand((2, 8, 6, 6), dtype, 43, scale=spread, shift=off)
    for launch in CL_LAUNCHES.values():
        y = gn.group_norm_silu(_cl(x), 2, eps=1e-6, _launch=launch)
        within(y, gn_chain(x, 2, eps=1e-6), f"offset {off} {launch}")


@pytest.mark.parametrize(
    "shape",
    [(2, 12, 4, 16), (1, 12, 2, 4, 8), (2, 13, 4, 16), (2, 12, 5, 7), (2, 10, 4, 8), (1, 20, 3, 5)],
    ids=["even", "even-5d", "odd-C", "odd-S", "pieces-8+2", "pieces-16+4-odd"],
)
@torch.no_grad()
def test_rms_column_pieces_masks_and_offsets(shape, monkeypatch):
    """The channel-RMS column as two power-of-two pieces (12 = 8 + 4; 10 = 8 + 2 and 20 = 16
    + 4, folded 4:1 for the sum): unmasked when they cover C and BS divides the positions
    (masked otherwise: odd C, odd positions), int32 offsets inside the block; the same bits
    as int64 offsets, within the contract of the fp64 reference."""
    x = _rand(shape, torch.bfloat16, 33)
    C = shape[1]
    st = gn.rms_settings(C, math.prod(shape[2:]))
    assert st.NCH == 1 and st.BC + st.BC1 >= C
    g = _rand((C, 1, 1) + (1,) * (len(shape) - 4), torch.bfloat16, 34, 0.5, 1.0)
    bias = _rand(g.shape, torch.bfloat16, 35, 0.2, 0.0)
    y = gn.rms_norm_silu_channels(x, g, bias)
    monkeypatch.setattr(gn, "OFF32_LIMIT", 0)
    assert torch.equal(y, gn.rms_norm_silu_channels(x, g, bias))
    within(y, rms_chain(x, g, bias), str(shape))


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["nchw", "channels_last", "channel_slice"])
@torch.no_grad()
def test_split_path_int64_tile_offsets(layout, monkeypatch):
    """Offsets inside a split-path tile are int32 from its int64 corner; past OFF32_LIMIT
    they are int64: the same elements, the same bits."""
    x = _rand((2, 12, 5, 7), torch.bfloat16, 31)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "channel_slice":
        x = _rand((2, 20, 5, 7), torch.bfloat16, 31)[:, 4:16]
    w, b = _params(12, torch.bfloat16, 31)
    y32 = gn.group_norm_silu(x, 3, w, b, _launch=SPLIT)
    monkeypatch.setattr(gn, "OFF32_LIMIT", 0)
    y64 = gn.group_norm_silu(x, 3, w, b, _launch=SPLIT)
    assert torch.equal(y32, y64)
    within(y64, gn_chain(x.contiguous(), 3, w, b), layout)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@torch.no_grad()
def test_large_offset_statistics(path, dtype):
    """Data far from 0 relative to its spread: E[x^2] - E[x]^2 would lose every digit of the
    variance at an offset of 1e5 in fp32; the two-pass / shifted statistics do not."""
    off, spread = (1e5, 1.0) if dtype == torch.float32 else (300.0, 8.0)
    x = _rand((1, 8, 6, 6), dtype, 3, scale=spread, shift=off)
    for silu in (False, True):
        y = gn.group_norm_silu(x, 2, eps=1e-6, silu=silu, _launch=PATHS[path])
        within(y, gn_chain(x, 2, eps=1e-6, silu=silu), f"offset {off} {path} silu={silu}")


@pytest.mark.parametrize("path", list(PATHS))
@torch.no_grad()
def test_silu_off_and_round_after_norm(path):
    x = _rand((1, 4, 5, 7), torch.bfloat16, 4)
    w, b = _params(4, torch.bfloat16, 4)
    for silu in (False, True):
        for rr in (False, True):
            y = gn.group_norm_silu(
                x, 2, w, b, 1e-5, silu=silu, round_after_norm=rr, _launch=PATHS[path]
            )
            ref = gn_chain(x, 2, w, b, 1e-5, silu=silu, round_after_norm=rr)
            within(y, ref, f"{path} silu={silu} round={rr}")


@torch.no_grad()
def test_paths_agree():
    x = _rand((2, 6, 5, 7), torch.float32, 5)
    w, b = _params(6, torch.float32, 5)
    outs = [gn.group_norm_silu(x, 3, w, b, _launch=PATHS[p]) for p in PATHS]
    ref = gn_chain(x, 3, w, b)
    for p, o in zip(PATHS, outs):
        within(o, ref, p)
        within(o, ref, f"{p} vs fit", against=outs[0], sides=2)


# ---------------------------------------------------------------------------------------
# against the models' eager code


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape,path", [((1, 64, 6, 6), "fit"), ((2, 64, 2, 3, 4), "fit"), ((1, 64, 3, 4), "split")]
)
@torch.no_grad()
def test_vs_torch_groupnorm_silu(shape, path, dtype):
    """The VAEs' ResNet norm: torch.nn.GroupNorm(32, C, eps=1e-6) then F.silu."""
    C = shape[1]
    norm = torch.nn.GroupNorm(32, C, eps=1e-6).to(DEVICE, dtype)
    norm.weight.copy_(_rand((C,), torch.float32, 6, 0.5, 1.0))
    norm.bias.copy_(_rand((C,), torch.float32, 7, 0.2, 0.0))
    x = _rand(shape, dtype, 8)
    eager = F.silu(norm(x))
    launch = PATHS[path] if path == "split" else None
    y = gn.group_norm_silu(x, norm.num_groups, norm.weight, norm.bias, norm.eps, _launch=launch)
    # eager rounds where the kernel does (after the norm, at the store), both in fp32: the
    # same contract; plus eager's rounding of the group statistics where torch makes it
    ref = gn_chain(x, 32, norm.weight, norm.bias, norm.eps)
    within(y, ref, f"{shape} {path} vs fp64")
    extra = (
        gc.eager_gn_stat_steps(ref, x, norm.weight)
        if gc._eager_gn_rounds_stats(x.device, dtype)
        else ()
    )
    share = within(y, ref, f"{shape} {path} vs eager", against=eager, extra=extra, sides=2)
    _note(f"gn vs eager torch {dtype}", share)
    if dtype != torch.float32 and not extra:
        assert share >= 0.99, share


def _wan_norm(C, images, bias, dtype):
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm

    m = WanRMS_norm(C, images=images, bias=bias).to(DEVICE, dtype)
    m.gamma.copy_(_rand(m.gamma.shape, torch.float32, 9, 0.5, 1.0))
    if bias:
        m.bias.copy_(_rand(m.bias.shape, torch.float32, 10, 0.2, 0.0))
    return m


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,bias", [((1, 48, 2, 4, 5), False), ((2, 40, 3, 5), True)])
@torch.no_grad()
def test_vs_diffusers_wan_rms_norm(shape, bias, dtype):
    """Wan's VAE: diffusers' WanRMS_norm (F.normalize(x, dim=1) * sqrt(C) * gamma + bias)
    then SiLU (gamma (C, 1, 1, 1) for video, (C, 1, 1) for images)."""
    C = shape[1]
    m = _wan_norm(C, images=len(shape) == 4, bias=bias, dtype=dtype)
    x = _rand(shape, dtype, 11)
    eager = F.silu(m(x))
    ref = rms_chain(x, m.gamma, m.bias)
    y = gn.rms_norm_silu_channels(x, m.gamma, m.bias)
    _note(f"rms vs fp64 {dtype}", within(y, ref, "rms vs fp64"))
    # eager half precision rounds where the kernel does (after normalize, * scale, * gamma,
    # + bias, and SiLU), both in fp32: the same contract
    share = within(y, ref, "rms vs eager WanRMS_norm", against=eager, sides=2)
    _note(f"rms vs eager diffusers {dtype}", share)
    if dtype != torch.float32:
        assert share >= 0.99, share


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@torch.no_grad()
def test_rms_chunked_column(dtype):
    """A column taller than the tile: sum of squares over channel chunks, then re-read."""
    x = _rand((2, 37, 3, 5), dtype, 12)
    g = _rand((37, 1, 1), dtype, 13, 0.5, 1.0)
    st = gn.rms_settings(37, 15, tile=64)
    assert st.NCH > 1
    for silu in (True, False):
        y = gn.rms_norm_silu_channels(x, g, silu=silu, _launch={"tile": 64})
        within(y, rms_chain(x, g, silu=silu), f"chunked silu={silu}")
    # eps floors the norm of an all-zero column, as F.normalize does
    z = torch.zeros(1, 4, 2, 2, dtype=dtype, device=DEVICE)
    assert torch.equal(gn.rms_norm_silu_channels(z, None), z)


# ---------------------------------------------------------------------------------------
# strided views: read and written in place, or a clear error


def _strided_cases():
    big = _rand((3, 20, 5, 6), torch.bfloat16, 14)
    v5 = _rand((1, 8, 4, 3, 5), torch.bfloat16, 15)
    return [
        ("channel slice", big[:, 3:11]),
        ("batch slice", big[1:, :8]),
        ("channels_last", big[:, :8].contiguous(memory_format=torch.channels_last)),
        ("channels_last_3d", v5.contiguous(memory_format=torch.channels_last_3d)),
        ("time slice", v5[:, :, 1:]),
        ("N/C transposed", _rand((8, 2, 5, 6), torch.bfloat16, 16).transpose(0, 1)),
    ]


@pytest.mark.parametrize("path", ["fit", "split"])
@pytest.mark.parametrize("case", _strided_cases(), ids=lambda c: c[0])
@torch.no_grad()
def test_strided_input_read_in_place(case, path):
    name, x = case
    assert not x.is_contiguous()
    p = gn.plan_group_norm(x, 4)
    assert p.x is x and p.xs[:2] == (x.stride(0), x.stride(1))  # addressed, not copied
    w, b = _params(x.shape[1], torch.bfloat16, 17)
    y = gn.group_norm_silu(x, 4, w, b, _launch=PATHS[path])
    within(y, gn_chain(x.contiguous(), 4, w, b), name)
    g = w[:, None, None] if x.dim() == 4 else w[:, None, None, None]
    yr = gn.rms_norm_silu_channels(x, g)
    within(yr, rms_chain(x.contiguous(), g), f"rms {name}")
    if x.is_contiguous(memory_format=torch.channels_last) or x.is_contiguous(
        memory_format=torch.channels_last_3d
    ):
        assert y.stride() == x.stride()  # a dense input's layout is kept


@torch.no_grad()
def test_uncollapsible_view_raises():
    big = _rand((1, 8, 5, 6), torch.bfloat16, 18)
    for v in (big[..., :3, :4], big.transpose(2, 3)):
        with pytest.raises(ValueError, match=r"x of shape .* x\.contiguous\(\)"):
            gn.group_norm_silu(v, 4)
        with pytest.raises(ValueError, match=r"x of shape"):
            gn.rms_norm_silu_channels(v, None)


@pytest.mark.parametrize("path", ["fit", "split"])
@torch.no_grad()
def test_out_into_channel_slice_and_in_place(path):
    x = _rand((2, 8, 5, 6), torch.bfloat16, 19)
    w, b = _params(8, torch.bfloat16, 19)
    ref = gn_chain(x, 4, w, b)
    buf = torch.full((2, 12, 5, 6), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    got = gn.group_norm_silu(x, 4, w, b, out=buf[:, 2:10], _launch=PATHS[path])
    assert got.data_ptr() == buf[:, 2:10].data_ptr()
    within(buf[:, 2:10], ref, "out= slice")
    assert torch.isnan(buf[:, :2]).all() and torch.isnan(buf[:, 10:]).all()  # untouched
    xi = x.clone()
    assert gn.group_norm_silu(xi, 4, w, b, out=xi, _launch=PATHS[path]) is xi
    within(xi, ref, "in place")
    # the channel RMS norm in place, its column held in registers or re-read in chunks
    ref = rms_chain(x, w)
    xi = x.clone()
    gn.rms_norm_silu_channels(xi, w, out=xi, _launch=dict(tile=64) if path != "fit" else None)
    within(xi, ref, "rms in place")


# ---------------------------------------------------------------------------------------
# poisoned outputs: an element a kernel does not write stays NaN and fails


@pytest.fixture
def poison(monkeypatch):
    def nan_like(x):
        return torch.full_like(x, float("nan"), memory_format=torch.preserve_format)

    def nan_partials(n, device):
        return torch.full((4 * n,), float("nan"), dtype=torch.float32, device=device)

    monkeypatch.setattr(gn, "_out_like", nan_like)
    monkeypatch.setattr(gn, "_partials", nan_partials)


@pytest.mark.parametrize("path", list(PATHS))
@torch.no_grad()
def test_poisoned_outputs(poison, path):
    for shape, G in (((2, 6, 5, 7), 3), ((1, 10, 2, 3, 5), 2)):
        x = _rand(shape, torch.float16, 20)
        y = gn.group_norm_silu(x, G, _launch=PATHS[path])
        within(y, gn_chain(x, G), f"poisoned {shape} {path}")
    for launch in CL_LAUNCHES.values():  # channels-last: partials and merged statistics
        x = _cl(_rand((2, 12, 5, 7), torch.float16, 20))
        y = gn.group_norm_silu(x, 3, _launch=launch)
        within(y, gn_chain(x.contiguous(), 3), f"poisoned channels-last {launch}")
    x = _rand((2, 37, 3, 5), torch.float16, 21)
    for launch in (None, dict(tile=64)):
        y = gn.rms_norm_silu_channels(x, None, _launch=launch)
        within(y, rms_chain(x), "poisoned rms")


# ---------------------------------------------------------------------------------------
# bad input: an error naming the argument, before any kernel runs


@pytest.fixture
def no_launch(monkeypatch):
    class Refuse:
        def __getitem__(self, grid):
            raise AssertionError("a kernel was launched")

    for k in (
        "_gn_fit_kernel",
        "_gn_stats_kernel",
        "_gn_apply_kernel",
        "_rms_ch_kernel",
        "_gn_cl_stats_kernel",
        "_gn_merge_kernel",
        "_gn_cl_apply_kernel",
    ):
        monkeypatch.setattr(gn, k, Refuse())


def _bad_cases():
    x = _rand((2, 8, 3, 4), torch.bfloat16, 22)
    w = torch.ones(8, dtype=torch.bfloat16, device=DEVICE)
    nan = lambda t: torch.full_like(t, float("nan"))  # noqa: E731
    big = torch.zeros(2, 8, 6, 4, dtype=torch.bfloat16, device=DEVICE)
    gnf, rms = gn.group_norm_silu, gn.rms_norm_silu_channels
    return [
        ("x not a tensor", lambda: gnf(x.tolist(), 4), TypeError, "x must be a torch.Tensor"),
        ("x int", lambda: gnf(x.to(torch.int32), 4), TypeError, "x.dtype"),
        ("x float64", lambda: gnf(x.double(), 4), TypeError, "x.dtype"),
        ("x 2-D", lambda: gnf(x[0, :, 0], 4), ValueError, "x must be channels-first"),
        ("x 2-D (N, C)", lambda: gnf(x[:, :, 0, 0], 4), ValueError, "x must be channels-first"),
        ("groups not dividing", lambda: gnf(x, 3), ValueError, "num_groups=3"),
        ("groups zero", lambda: gnf(x, 0), ValueError, "num_groups=0"),
        ("groups float", lambda: gnf(x, 4.0), ValueError, "num_groups=4.0"),
        (
            "weight size",
            lambda: gnf(x, 4, torch.ones(9, device=DEVICE)),
            ValueError,
            "weight has shape (9,)",
        ),
        (
            "weight 2-D",
            lambda: gnf(x, 4, torch.ones(4, 2, device=DEVICE)),
            ValueError,
            "weight has shape (4, 2)",
        ),
        (
            "weight int",
            lambda: gnf(x, 4, torch.ones(8, dtype=torch.int64, device=DEVICE)),
            TypeError,
            "weight.dtype",
        ),
        ("weight not tensor", lambda: gnf(x, 4, [1.0] * 8), TypeError, "weight must be"),
        (
            "weight device",
            lambda: gnf(x, 4, torch.ones(8, device="meta")),
            ValueError,
            "weight is on meta",
        ),
        (
            "bias size",
            lambda: gnf(x, 4, w, torch.ones(4, device=DEVICE)),
            ValueError,
            "bias has shape (4,)",
        ),
        ("eps negative", lambda: gnf(x, 4, eps=-1.0), ValueError, "eps"),
        ("eps nan", lambda: gnf(x, 4, eps=float("nan")), ValueError, "eps"),
        ("silu not bool", lambda: gnf(x, 4, silu=1), TypeError, "silu"),
        ("out dtype", lambda: gnf(x, 4, out=nan(x.float())), TypeError, "out.dtype"),
        ("out shape", lambda: gnf(x, 4, out=nan(x[:1])), ValueError, "out.shape"),
        (
            "out device",
            lambda: gnf(x, 4, out=torch.empty(x.shape, dtype=x.dtype, device="meta")),
            ValueError,
            "out is on meta",
        ),
        (
            "out expanded",
            lambda: gnf(x, 4, out=nan(x[:1]).expand(x.shape)),
            ValueError,
            "out has overlapping",
        ),
        (
            "out overlaps x",
            lambda: gnf(big[:, :, :3], 4, out=big[:, :, 1:4]),
            ValueError,
            "overlaps x",
        ),
        (
            "out spatial crop",
            lambda: gnf(x, 4, out=torch.empty(2, 8, 3, 5, dtype=x.dtype, device=DEVICE)[..., :4]),
            ValueError,
            "out of shape",
        ),
        (
            "rms gamma size",
            lambda: rms(x, torch.ones(8, 2, 1, device=DEVICE)),
            ValueError,
            "gamma has shape (8, 2, 1)",
        ),
        (
            "rms gamma int",
            lambda: rms(x, torch.ones(8, dtype=torch.int32, device=DEVICE)),
            TypeError,
            "gamma.dtype",
        ),
        ("rms bias float", lambda: rms(x, w, 0.5), TypeError, "bias must be"),
        ("rms scale", lambda: rms(x, w, scale=float("inf")), ValueError, "scale"),
        ("rms eps", lambda: rms(x, w, eps=-1e-12), ValueError, "eps"),
        ("rms x 2-D", lambda: rms(x[:, :, 0, 0], w), ValueError, "x must be channels-first"),
    ]


@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
@torch.no_grad()
def test_bad_input_raises_before_launch(no_launch, case):
    name, call, exc, text = case
    with pytest.raises(exc) as info:
        call()
    assert text in str(info.value), f"{name}: message {str(info.value)!r} does not name {text!r}"


def test_requires_grad_rejected():
    x = _rand((1, 8, 3, 4), torch.float32, 23).requires_grad_()
    with pytest.raises(RuntimeError, match="inference-only"):
        gn.group_norm_silu(x, 4)
    w = torch.ones(8, device=DEVICE, requires_grad=True)
    with pytest.raises(RuntimeError, match="inference-only"):
        gn.rms_norm_silu_channels(x.detach(), w)


@torch.no_grad()
def test_empty_and_fallback(monkeypatch):
    e = torch.empty(0, 8, 3, 4, dtype=torch.bfloat16, device=DEVICE)
    assert gn.group_norm_silu(e, 4).shape == e.shape
    assert gn.rms_norm_silu_channels(e, None).shape == e.shape
    # a device Triton cannot run on: the fp32 reference, same contract
    from ditfuse.runtime import backend as _runtime

    monkeypatch.setattr(_runtime, "kernel_device_ok", lambda t: False)
    x = _rand((2, 8, 3, 4), torch.bfloat16, 24)
    within(gn.group_norm_silu(x, 4), gn_chain(x, 4), "fallback")
    within(gn.rms_norm_silu_channels(x, None), rms_chain(x), "fallback rms")


# ---------------------------------------------------------------------------------------
# the contract itself: an intermediate rounding that flips is amplified by SiLU (what the
# old "one rounding of the output" gate failed on at the VAE shapes on an H200), and
# wrong outputs are still caught


def _bump_ulps(t, i, k):
    """A copy of ``t`` with flat element ``i`` moved ``k`` ulps away from 0."""
    bad = t.clone()
    bad.view(torch.int16).view(-1)[i] += k
    return bad


def test_contract_helpers():
    yc = gc._SILU_YC
    assert abs(yc * math.tanh(yc / 2) - 2) < 1e-12  # silu'' = 0 there
    lo = torch.linspace(-9, 7, 65, dtype=torch.float64)
    for width in (1e-3, 0.3, 3.0, 12.0):
        hi = lo + width
        t = lo[:, None] + width * torch.linspace(0, 1, 4001, dtype=torch.float64)[None, :]
        brute = gc._silu_slope(t).abs().amax(1)
        got = gc.silu_slope_max(lo, hi)
        assert (got >= brute - 1e-15).all() and (got <= brute + 1e-6).all(), width
    # one rounding per side in fp32 straddles a bf16 / fp16 midpoint at most this often
    assert gc.differ_limit(torch.bfloat16, 2) == pytest.approx(2 * 2 * 2e-6 * 2**7)  # 0.10%
    assert gc.differ_limit(torch.float16, 1, sides=2) == pytest.approx(2 * 2 * 2e-6 * 2**10)
    assert gc.differ_limit(torch.float32, 2) is None
    assert gc.differ_allowed(0.0, 10) == 1.0 and gc.differ_allowed(1e-3, 10**6) < 1100


@torch.no_grad()
def test_intermediate_flip_group_norm():
    """Statistics two fp32 ulps off (rstd * (1 + 2^-22), a legitimate fp32 kernel) put one
    pre-activation on the other side of the bf16 midpoint -4.015625: it rounds to -4.03125
    instead of -4, and SiLU turns that spacing of y into 3 bf16 ulps of the output, 1.8 of
    the old gate's tolerance (one rounding of the output). The contract carries the flip
    through silu' and passes it; one element differs."""
    bf = torch.bfloat16
    x = _rand((1, 2, 4, 4), bf, 30)
    st = gn_chain(x, 1).stats
    norm = ((x.double() - st["mean"]) * st["rstd"]).flatten()
    i = norm.argmin().item()
    m = -4.015625  # halfway between the bf16 values -4 and -4.03125
    w = torch.ones(2, dtype=torch.float64, device=DEVICE)
    w[i // 16] = m * (1 - 2.0**-23) / norm[i].item()  # y = m (1 - 2^-23): rounds to -4
    ref = gn_chain(x, 1, w)
    off = gn_chain(x, 1, w * (1 + 2.0**-22))  # as if rstd were 2^-22 higher
    assert ref.silu_in.flatten()[i] == -4.0 and off.silu_in.flatten()[i] == -4.03125
    p = gc.parity(off.out, ref.out, ref)
    assert p.n_differ == 1 and p.err_one > 1.5, p.describe()  # the old gate fails
    assert p.ok, p.describe()  # err/tol 0.58


@torch.no_grad()
def test_intermediate_flips_wan_chain():
    """Wan's chain rounds after normalize, * sqrt(C) and * gamma. In this column the first
    channel normalises to within one fp32 ulp of a bf16 midpoint (-0.7324219 between
    -0.73046875 and -0.734375): a normalisation 2^-22 off (3 fp32 ulps) flips r1, * sqrt(C) *
    gamma carries that spacing to y = -4.94 (one spacing of y there), and SiLU to 4 bf16 ulps
    of the output, 1.9 of one output rounding; within the contract, which propagates each
    intermediate rounding through the later multiplications and silu'."""
    bf = torch.bfloat16
    C = 24
    x = torch.full((1, C, 1), 0.34375, dtype=bf, device=DEVICE)
    x[0, 0, 0] = -1.7734375
    g = torch.ones(C, 1, dtype=bf, device=DEVICE)
    g[0] = 1.375
    ref = rms_chain(x, g)

    def r(t):
        return t.to(bf).double()

    xs = x.double()
    r1 = r(xs / xs.pow(2).sum(1, keepdim=True).sqrt() * (1 - 2.0**-22))
    v = r(r(r1 * C**0.5) * g.double())
    out = (v / (1 + torch.exp(-v))).to(bf)
    assert ref.steps[0][0][0, 0, 0] == -0.734375 and r1[0, 0, 0] == -0.73046875
    assert ref.silu_in[0, 0, 0] == -4.9375 and v[0, 0, 0] == -4.90625
    p = gc.parity(out, ref.out, ref)
    assert p.n_differ == 1 and p.err_one > 1.5, p.describe()
    assert p.ok, p.describe()
    within(gn.rms_norm_silu_channels(x, g), ref, "kernel on the same column")


@torch.no_grad()
def test_contract_catches_wrong_outputs():
    bf = torch.bfloat16
    x = _rand((1, 64, 8, 8), bf, 31)
    w, b = _params(64, bf, 31)
    ref = gn_chain(x, 32, w, b)
    y = gn.group_norm_silu(x, 32, w, b)
    assert gc.parity(y, ref.out, ref).ok
    # one element 2 ulps off where the pre-activation is nearest silu's minimum (-1.2785):
    # a flip of y barely moves the output there, so the bound is ~1.25 output roundings.
    # (Where |silu'(y)| spacing(y) >= an output ulp -- y ~ 0 or y > 0, most of the range --
    # a flip of y plus the output's rounding legitimately make 2 ulps; the bound there is
    # 2-3 ulps, and only the share of differing elements sees a systematic 1-2 ulp error.)
    i = (ref.silu_in.flatten() + 1.2785).abs().argmin().item()
    tol = gc.contract_tolerance(ref, ref.out).flatten()[i].item()
    ulp = 2.0 ** (math.floor(math.log2(abs(ref.out.flatten()[i].item()))) - 7)
    assert tol < 1.3 * ulp
    p = gc.parity(_bump_ulps(y, i, 2), ref.out, ref)
    assert not p.ok and p.err > 1, p.describe()
    # the rounding after the norm skipped: every element stays within a flip of y (passes
    # per element), but a quarter of them differ: the share limit (0.10%) catches it
    p = gc.parity(gn.group_norm_silu(x, 32, w, b, round_after_norm=False), ref.out, ref)
    assert p.err <= 1 and p.differ > 0.05 and not p.ok, p.describe()
    # unbiased instead of biased variance (y * sqrt((n - 1) / n), n = 128: 2^-8 relative)
    n = 2 * 8 * 8
    p = gc.parity(gn_chain(x, 32, w.double() * math.sqrt((n - 1) / n), b).out, ref.out, ref)
    assert p.differ > 0.05 and not p.ok, p.describe()
    # the same for Wan's chain: an r1 rounding skipped
    g = w[:, None, None]
    ref = rms_chain(x, g)
    p = gc.parity(rms_chain(x, g, round_after_norm=False).out, ref.out, ref)
    assert not p.ok, p.describe()


@torch.no_grad()
def test_eager_rounded_statistics():
    """torch's CUDA GroupNorm before pytorch#183946 (torch 2.11 on the H200) rounds each
    group's mean and rstd to x's dtype before applying them: emulated here, it differs from
    the kernel at ~20-30% of the elements, so the plain contract fails (share); with its
    own roundings added (``eager_gn_stat_steps``) every element is within the bound."""
    bf = torch.bfloat16
    x = _rand((1, 64, 8, 8), bf, 32)
    w, b = _params(64, bf, 32)
    ref = gn_chain(x, 32, w, b)
    mean, rstd = ref.stats["mean"].to(bf).double(), ref.stats["rstd"].to(bf).double()
    v = (
        ((x.double() - mean) * rstd * w.double().view(1, -1, 1, 1) + b.double().view(1, -1, 1, 1))
        .to(bf)
        .double()
    )
    eager = (v / (1 + torch.exp(-v))).to(bf)
    y = gn.group_norm_silu(x, 32, w, b)
    assert not gc.parity(y, eager, ref, sides=2).ok
    p = gc.parity(y, eager, ref, gc.eager_gn_stat_steps(ref, x, w), sides=2, gate_differ=False)
    assert p.ok and p.differ > 0.05, p.describe()
    if DEVICE == "cpu":  # torch's CPU GroupNorm keeps its statistics in fp32
        assert not gc._eager_gn_rounds_stats("cpu", bf)


# ---------------------------------------------------------------------------------------
# launch table, registry, check gates


def test_launch_table():
    # the VAE shapes: groups of 16 ch x 128^2 (and larger) take the split path
    for s in GN_SHAPES.values():
        if s.op != "gn":
            continue
        st = gn.gn_settings(
            s.shape[0], 32, s.C // 32, math.prod(s.shape[2:]), c_inner=s.channels_last
        )
        assert st.path == ("split-cl" if s.channels_last else "split"), s
        assert st.BC * st.BS <= gn.GN_TABLE.tile
        if s.channels_last:  # one tile of whole groups' lanes; a merge program a group
            assert st.BC == st.GB * st.CPP <= gn.GN_TABLE.cl_lanes and st.CPP == s.C // 32
            continue
        assert st.P <= gn.GN_TABLE.max_partials
        assert st.TPP & (st.TPP - 1) == 0 and (st.P - 1) * st.TPP < st.T <= st.P * st.TPP
        assert st.P_PAD >= st.P
    fit = gn.gn_settings(1, 32, 16, 32 * 32)  # 16 ch x 32^2 = 16K elements: one program
    assert fit.path == "fit" and fit.BC * fit.BS <= gn.GN_TABLE.fit_max and fit.num_warps == 16
    assert gn.gn_settings(1, 32, 16, 32 * 33).path == "split"
    r = gn.rms_settings(384, 60 * 104)
    assert r.NCH == 1 and r.BC * r.BS <= gn.RMS_TABLE.tile
    assert gn.rms_settings(4096, 100).NCH > 1


def test_check_gates_small():
    class Rows:
        def __init__(self):
            self.rows = []

        def add(self, gate, case, ok, detail):
            self.rows.append((gate, case, ok, detail))

    g = Rows()
    shapes = [
        GN_SHAPES["hunyuan-vae-up-9f"],
        GN_SHAPES["flux-vae-mid-128"],
        GN_SHAPES["wan-vae-mid-480p"],
    ]
    check_group_norm.check_gates(
        g, DEVICE, True, dtypes=[torch.bfloat16, torch.float32], shapes=shapes
    )
    # 3 shapes + the first one on the forced split paths (channels-first and -last), 2 dtypes
    assert len(g.rows) == 10
    assert sum(" split;" in r[3] for r in g.rows) == 2
    assert sum(" split-cl;" in r[3] for r in g.rows) == 2
    assert all(r[2] for r in g.rows), [r for r in g.rows if not r[2]]


# ---------------------------------------------------------------------------------------
# torch.library: opcheck, torch.compile(fullgraph=True)


@torch.no_grad()
def test_opcheck():
    x = _rand((2, 8, 3, 4), torch.bfloat16, 25)
    w, b = _params(8, torch.bfloat16, 25)
    torch.library.opcheck(
        torch.ops.ditfuse.group_norm_silu.default, (x, 4, w, b, 1e-6, True, False)
    )
    torch.library.opcheck(
        torch.ops.ditfuse.group_norm_silu.default,
        (x.contiguous(memory_format=torch.channels_last), 2, None, None, 1e-5, False, True),
    )
    g = w[:, None, None]
    torch.library.opcheck(
        torch.ops.ditfuse.rms_norm_silu_channels.default, (x, g, None, 1e-12, None, True, False)
    )
    torch.library.opcheck(
        torch.ops.ditfuse.rms_norm_silu_channels.default, (x, g, b, 1e-12, 2.0, False, True)
    )


@pytest.mark.parametrize("with_out", [False, True])
@torch.no_grad()
def test_compile_fullgraph(with_out):
    x = _rand((2, 8, 3, 4), torch.bfloat16, 26)
    w, b = _params(8, torch.bfloat16, 26)
    g = w[:, None, None]
    torch._dynamo.reset()

    def f(x, w, b, o1, o2):
        h = x * 1.5  # surrounding ops, so the graph holds more than the custom ops
        y = gn.group_norm_silu(h, 4, w, b, 1e-6, out=o1)
        z = gn.rms_norm_silu_channels(h, g, 0.0, out=o2)
        return y + 1, z

    def outs():
        return (torch.empty_like(x), torch.empty_like(x)) if with_out else (None, None)

    want = f(x, w, b, *outs())
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(x, w, b, *outs())
    for a, e in zip(got, want):
        assert torch.equal(a, e)


def test_zz_report_bitwise_shares():
    """Print the smallest bitwise-equal share seen per comparison (visible with -s)."""
    for k in sorted(SHARES):
        print(f"  {k:55s} {100 * SHARES[k]:6.2f}% bitwise")
