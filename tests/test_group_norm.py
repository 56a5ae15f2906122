"""group_norm_silu / rms_norm_silu_channels: fp64 reference on both paths, torch's GroupNorm
and diffusers' WanRMS_norm, strided views, poisoned outputs, bad input, torch.library."""
import math

import pytest
import torch
import torch.nn.functional as F

import ditfuse  # noqa: F401  (sets up the interpreter)
from ditfuse import group_norm as gn
from ditfuse.reference import group_norm_silu_reference, rms_norm_silu_channels_reference
from conftest import DEVICE, DTYPES, assert_close_report

# SiLU of a very negative fp32 value: exp(-y) overflows to inf and y / inf = -0, as in
# PyTorch; numpy (the interpreter) warns about it
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

# Launch-table overrides that force each path at small shapes:
FIT = None                                    # the default table: these groups fit
SPLIT = dict(fit_max=0, tile=16)              # split: 16-element tiles, one partial a tile
SPLIT_LOOP = dict(fit_max=0, tile=16, max_partials=3)  # several tiles a statistics program,
                                              # masked tail tiles past the group's end
PATHS = {"fit": FIT, "split": SPLIT, "split-loop": SPLIT_LOOP}

# one rounding of the activation dtype: relative ulp at the bottom of a binade, with an
# absolute floor for results near 0
ONE = {torch.bfloat16: (2.0**-7, 2.0**-12), torch.float16: (2.0**-10, 2.0**-14),
       torch.float32: (2e-6, 2e-6)}
SHARES = {}  # bitwise shares seen, printed at the end (pytest -s)


def _rand(shape, dtype, seed, scale=2.0, shift=0.5):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * scale + shift).to(dtype).to(DEVICE)


def _params(C, dtype, seed, shape=None):
    shape = shape or (C,)
    return _rand(shape, dtype, seed + 1, 0.5, 1.0), _rand(shape, dtype, seed + 2, 0.2, 0.0)


def within(out, ref, dtype, roundings=2.0, what=""):
    """|out - ref| <= roundings * (rtol |ref| + atol); returns the bitwise-equal share.

    Default two roundings: by default the op rounds after the norm and at the store, and
    the fp64 reference rounds at the same points, so a tie flipped at the first rounding
    by fp32 vs fp64 arithmetic can add an ulp."""
    assert out.shape == ref.shape and out.dtype == ref.dtype, (out.shape, ref.shape, out.dtype)
    assert not torch.isnan(out).any(), f"{what}: NaN in the output"
    rtol, atol = ONE[dtype]
    torch.testing.assert_close(out.double(), ref.double(), rtol=roundings * rtol,
                               atol=roundings * atol, msg=lambda m: f"{what}: {m}")
    return (out == ref).float().mean().item()


def _note(key, share):
    SHARES[key] = min(share, SHARES.get(key, 1.0))


def _path_of(x, G, launch):
    N, C = x.shape[:2]
    return gn.gn_settings(N, G, C // G, math.prod(x.shape[2:]), **(launch or {})).path


# ---------------------------------------------------------------------------------------
# against the fp64 reference: within one rounding

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
    ref = group_norm_silu_reference(x, G, w, b, 1e-6, compute_dtype=torch.float64)
    _note(f"gn fit vs fp64 {dtype}", within(y, ref, dtype, what=name))


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
    ref = group_norm_silu_reference(x, G, w, b, 1e-6, compute_dtype=torch.float64)
    _note(f"gn split vs fp64 {dtype}", within(y, ref, dtype, what=f"{name} {path}"))


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
        ref = group_norm_silu_reference(x, 2, eps=1e-6, silu=silu, compute_dtype=torch.float64)
        within(y, ref, dtype, what=f"offset {off} {path} silu={silu}")


@pytest.mark.parametrize("path", list(PATHS))
@torch.no_grad()
def test_silu_off_and_round_after_norm(path):
    x = _rand((1, 4, 5, 7), torch.bfloat16, 4)
    w, b = _params(4, torch.bfloat16, 4)
    for silu in (False, True):
        for rr in (False, True):
            y = gn.group_norm_silu(x, 2, w, b, 1e-5, silu=silu, round_after_norm=rr,
                                   _launch=PATHS[path])
            ref = group_norm_silu_reference(x, 2, w, b, 1e-5, silu=silu, round_after_norm=rr,
                                            compute_dtype=torch.float64)
            within(y, ref, torch.bfloat16, what=f"{path} silu={silu} round={rr}")


@torch.no_grad()
def test_paths_agree():
    x = _rand((2, 6, 5, 7), torch.float32, 5)
    w, b = _params(6, torch.float32, 5)
    outs = [gn.group_norm_silu(x, 3, w, b, _launch=PATHS[p]) for p in PATHS]
    for o in outs[1:]:
        within(o, outs[0], torch.float32, what="split vs fit")


# ---------------------------------------------------------------------------------------
# against the models' eager code

@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,path", [((1, 64, 6, 6), "fit"), ((2, 64, 2, 3, 4), "fit"),
                                        ((1, 64, 3, 4), "split")])
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
    # eager rounds between GroupNorm and SiLU, the kernel once at the end: they differ by
    # at most a rounding of the output plus one of the normalised value
    _note(f"gn vs eager torch {dtype}", assert_close_report(y, eager, dtype, f"{shape} {path}"))
    if dtype != torch.float32:
        # rounding where eager rounds: the same chain of roundings
        y2 = gn.group_norm_silu(x, norm.num_groups, norm.weight, norm.bias, norm.eps,
                                round_after_norm=True, _launch=launch)
        share = within(y2, eager, dtype, what=f"{shape} round_after_norm")
        _note(f"gn round_after_norm vs eager torch {dtype}", share)
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
    ref = rms_norm_silu_channels_reference(x, m.gamma, m.bias, compute_dtype=torch.float64)
    y = gn.rms_norm_silu_channels(x, m.gamma, m.bias)
    _note(f"rms vs fp64 {dtype}", within(y, ref, dtype, what="rms vs fp64"))
    # eager half precision rounds after normalize, * scale, * gamma (+ bias) and SiLU
    roundings = 1.0 if dtype == torch.float32 else 4.0
    _note(f"rms vs eager diffusers {dtype}",
          within(y, eager, dtype, roundings, what="rms vs eager WanRMS_norm"))
    if dtype != torch.float32:
        y2 = gn.rms_norm_silu_channels(x, m.gamma, m.bias, round_after_norm=True)
        share = within(y2, eager, dtype, what="rms round_after_norm vs eager")
        _note(f"rms round_after_norm vs eager diffusers {dtype}", share)
        assert share >= 0.99, share


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@torch.no_grad()
def test_rms_chunked_column(dtype):
    """A column taller than the tile: sum of squares over channel chunks, then re-read."""
    x = _rand((2, 37, 3, 5), dtype, 12)
    g = _rand((37, 1, 1), dtype, 13, 0.5, 1.0)
    st = gn.rms_settings(37, 15, tile=64)
    assert st.NCH > 1
    ref = rms_norm_silu_channels_reference(x, g, compute_dtype=torch.float64)
    for silu in (True, False):
        ref = rms_norm_silu_channels_reference(x, g, silu=silu, compute_dtype=torch.float64)
        y = gn.rms_norm_silu_channels(x, g, silu=silu, _launch=dict(tile=64))
        within(y, ref, dtype, what=f"chunked silu={silu}")
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
    ref = group_norm_silu_reference(x.contiguous(), 4, w, b, compute_dtype=torch.float64)
    within(y, ref, torch.bfloat16, what=name)
    g = w[:, None, None] if x.dim() == 4 else w[:, None, None, None]
    yr = gn.rms_norm_silu_channels(x, g)
    within(yr, rms_norm_silu_channels_reference(x.contiguous(), g, compute_dtype=torch.float64),
           torch.bfloat16, what=f"rms {name}")
    if x.is_contiguous(memory_format=torch.channels_last) or \
            x.is_contiguous(memory_format=torch.channels_last_3d):
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
    ref = group_norm_silu_reference(x, 4, w, b, compute_dtype=torch.float64)
    buf = torch.full((2, 12, 5, 6), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    got = gn.group_norm_silu(x, 4, w, b, out=buf[:, 2:10], _launch=PATHS[path])
    assert got.data_ptr() == buf[:, 2:10].data_ptr()
    within(buf[:, 2:10], ref, torch.bfloat16, what="out= slice")
    assert torch.isnan(buf[:, :2]).all() and torch.isnan(buf[:, 10:]).all()  # untouched
    xi = x.clone()
    assert gn.group_norm_silu(xi, 4, w, b, out=xi, _launch=PATHS[path]) is xi
    within(xi, ref, torch.bfloat16, what="in place")
    # the channel RMS norm in place, its column held in registers or re-read in chunks
    ref = rms_norm_silu_channels_reference(x, w, compute_dtype=torch.float64)
    xi = x.clone()
    gn.rms_norm_silu_channels(xi, w, out=xi, _launch=dict(tile=64) if path == "split" else None)
    within(xi, ref, torch.bfloat16, what="rms in place")


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
        within(y, group_norm_silu_reference(x, G, compute_dtype=torch.float64), torch.float16,
               what=f"poisoned {shape} {path}")
    x = _rand((2, 37, 3, 5), torch.float16, 21)
    for launch in (None, dict(tile=64)):
        y = gn.rms_norm_silu_channels(x, None, _launch=launch)
        within(y, rms_norm_silu_channels_reference(x, compute_dtype=torch.float64),
               torch.float16, what="poisoned rms")


# ---------------------------------------------------------------------------------------
# bad input: an error naming the argument, before any kernel runs

@pytest.fixture
def no_launch(monkeypatch):
    class Refuse:
        def __getitem__(self, grid):
            raise AssertionError("a kernel was launched")

    for k in ("_gn_fit_kernel", "_gn_stats_kernel", "_gn_apply_kernel", "_rms_ch_kernel"):
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
        ("weight size", lambda: gnf(x, 4, torch.ones(9, device=DEVICE)), ValueError, "weight has shape (9,)"),
        ("weight 2-D", lambda: gnf(x, 4, torch.ones(4, 2, device=DEVICE)), ValueError, "weight has shape (4, 2)"),
        ("weight int", lambda: gnf(x, 4, torch.ones(8, dtype=torch.int64, device=DEVICE)), TypeError, "weight.dtype"),
        ("weight not tensor", lambda: gnf(x, 4, [1.0] * 8), TypeError, "weight must be"),
        ("weight device", lambda: gnf(x, 4, torch.ones(8, device="meta")), ValueError, "weight is on meta"),
        ("bias size", lambda: gnf(x, 4, w, torch.ones(4, device=DEVICE)), ValueError, "bias has shape (4,)"),
        ("eps negative", lambda: gnf(x, 4, eps=-1.0), ValueError, "eps"),
        ("eps nan", lambda: gnf(x, 4, eps=float("nan")), ValueError, "eps"),
        ("silu not bool", lambda: gnf(x, 4, silu=1), TypeError, "silu"),
        ("out dtype", lambda: gnf(x, 4, out=nan(x.float())), TypeError, "out.dtype"),
        ("out shape", lambda: gnf(x, 4, out=nan(x[:1])), ValueError, "out.shape"),
        ("out device", lambda: gnf(x, 4, out=torch.empty(x.shape, dtype=x.dtype, device="meta")), ValueError, "out is on meta"),
        ("out expanded", lambda: gnf(x, 4, out=nan(x[:1]).expand(x.shape)), ValueError, "out has overlapping"),
        ("out overlaps x", lambda: gnf(big[:, :, :3], 4, out=big[:, :, 1:4]), ValueError, "overlaps x"),
        ("out spatial crop", lambda: gnf(x, 4, out=torch.empty(2, 8, 3, 5, dtype=x.dtype, device=DEVICE)[..., :4]), ValueError, "out of shape"),
        ("rms gamma size", lambda: rms(x, torch.ones(8, 2, 1, device=DEVICE)), ValueError, "gamma has shape (8, 2, 1)"),
        ("rms gamma int", lambda: rms(x, torch.ones(8, dtype=torch.int32, device=DEVICE)), TypeError, "gamma.dtype"),
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
    from ditfuse import _runtime
    monkeypatch.setattr(_runtime, "kernel_device_ok", lambda t: False)
    x = _rand((2, 8, 3, 4), torch.bfloat16, 24)
    within(gn.group_norm_silu(x, 4),
           group_norm_silu_reference(x, 4, compute_dtype=torch.float64), torch.bfloat16)
    within(gn.rms_norm_silu_channels(x, None),
           rms_norm_silu_channels_reference(x, compute_dtype=torch.float64), torch.bfloat16)


# ---------------------------------------------------------------------------------------
# launch table, registry, check gates

def test_launch_table():
    # the VAE shapes: groups of 16 ch x 128^2 (and larger) take the split path
    for s in gn.GN_SHAPES.values():
        if s.op != "gn":
            continue
        st = gn.gn_settings(s.shape[0], 32, s.C // 32, math.prod(s.shape[2:]))
        assert st.path == "split", s
        assert st.BC * st.BS <= gn.SPLIT_TILE and st.P <= gn.MAX_PARTIALS
        assert st.TPP & (st.TPP - 1) == 0 and (st.P - 1) * st.TPP < st.T <= st.P * st.TPP
        assert st.P_PAD >= st.P
    fit = gn.gn_settings(1, 32, 16, 32 * 32)  # 16 ch x 32^2 = 16K elements: one program
    assert fit.path == "fit" and fit.BC * fit.BS <= gn.FIT_MAX and fit.num_warps == 16
    assert gn.gn_settings(1, 32, 16, 32 * 33).path == "split"
    r = gn.rms_settings(384, 60 * 104)
    assert r.NCH == 1 and r.BC * r.BS <= gn.RMS_TILE
    assert gn.rms_settings(4096, 100).NCH > 1


def test_check_gates_small():
    class Rows:
        def __init__(self):
            self.rows = []

        def add(self, gate, case, ok, detail):
            self.rows.append((gate, case, ok, detail))

    g = Rows()
    shapes = [gn.GN_SHAPES["hunyuan-vae-up-9f"], gn.GN_SHAPES["flux-vae-mid-128"],
              gn.GN_SHAPES["wan-vae-mid-480p"]]
    gn.check_gates(g, DEVICE, True, dtypes=[torch.bfloat16, torch.float32], shapes=shapes)
    assert len(g.rows) == 8  # 3 shapes + the first one on the forced split path, 2 dtypes
    assert sum("split" in r[3] for r in g.rows) == 2
    assert all(r[2] for r in g.rows), [r for r in g.rows if not r[2]]


# ---------------------------------------------------------------------------------------
# torch.library: opcheck, torch.compile(fullgraph=True)

@torch.no_grad()
def test_opcheck():
    x = _rand((2, 8, 3, 4), torch.bfloat16, 25)
    w, b = _params(8, torch.bfloat16, 25)
    torch.library.opcheck(torch.ops.ditfuse.group_norm_silu.default, (x, 4, w, b, 1e-6, True, False))
    torch.library.opcheck(torch.ops.ditfuse.group_norm_silu.default,
                          (x.contiguous(memory_format=torch.channels_last), 2, None, None, 1e-5,
                           False, True))
    g = w[:, None, None]
    torch.library.opcheck(torch.ops.ditfuse.rms_norm_silu_channels.default,
                          (x, g, None, 1e-12, None, True, False))
    torch.library.opcheck(torch.ops.ditfuse.rms_norm_silu_channels.default,
                          (x, g, b, 1e-12, 2.0, False, True))


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
