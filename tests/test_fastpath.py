"""Replayed calls (``ditfuse/runtime/fastpath.py``): a call whose signature was seen before
reuses the recorded launches with its own tensors. Each case calls an op twice with fresh
data of one signature, checks the second call was a replay and that it equals the checked
path (the cache off) bitwise, with NaN-poisoned outputs; aliasing at record time, in-place
outputs, changed signatures and nested recordings are covered."""

import re
import sys
from pathlib import Path

import pytest
import torch
from conftest import DEVICE, rope_tables

import ditfuse
from ditfuse.norms import NormSpec
from ditfuse.ops import activations, adaln
from ditfuse.ops import attention as attn_mod
from ditfuse.ops import group_norm as gn
from ditfuse.runtime import fastpath as _fastpath

qk_mod = sys.modules["ditfuse.ops.qk_norm_rope"]
CACHES = (adaln._CACHE, activations._CACHE, qk_mod._CACHE, gn._CACHE, attn_mod._CACHE)


@pytest.fixture
def replays(monkeypatch):
    """Counts replays; clears the caches before and after."""
    for c in CACHES:
        c.clear()
    n = [0]
    orig = _fastpath.Replay.__call__

    def counted(self, tensors):
        n[0] += 1
        return orig(self, tensors)

    monkeypatch.setattr(_fastpath.Replay, "__call__", counted)
    yield n
    for c in CACHES:
        c.clear()


def _checked(fn):
    """fn() with the cache off: the checked path."""
    _fastpath.ENABLED = False
    try:
        return fn()
    finally:
        _fastpath.ENABLED = True


def _equal(a, b):
    a = a if isinstance(a, (tuple, list)) else (a,)
    b = b if isinstance(b, (tuple, list)) else (b,)
    assert len(a) == len(b)
    for u, v in zip(a, b):
        if u is None:
            assert v is None
            continue
        assert not torch.isnan(u).any()
        assert torch.equal(u, v)


def _rand(*shape, dtype=torch.bfloat16, g=None):
    return (torch.randn(*shape, generator=g) * 1.5 + 0.2).to(dtype).to(DEVICE)


def _clone(ins):
    return tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in ins)


def _twice(make, op, replays, expect_replay=True):
    """op(*make()) twice with fresh inputs of one signature; the second must be a replay
    (when expected); each equals the checked path on a copy of its inputs, bitwise."""
    g = torch.Generator().manual_seed(1)
    outs = []
    for i in range(2):
        ins = make(g)
        copy = _clone(ins)  # before an in-place op changes ins
        before = replays[0]
        got = op(*ins)
        if i == 1:
            assert (replays[0] > before) == expect_replay
        _equal(got, _checked(lambda: op(*copy)))
        outs.append(got)
    return outs


ADALN_CASES = {
    "modulate-flux": (
        lambda g: (_rand(2, 7, 48, g=g), *_rand(2, 6 * 48, g=g).chunk(6, 1)[:2]),
        lambda x, sh, sc: ditfuse.adaln_modulate(x, sh, sc, rounding="per_op"),
    ),
    "modulate-2d-rms-affine": (
        lambda g: (
            _rand(5, 40, g=g),
            _rand(40, dtype=torch.float32, g=g),
            _rand(5, 40, dtype=torch.float32, g=g),
            _rand(40, dtype=torch.float32, g=g),
        ),
        lambda x, sh, sc, w: ditfuse.adaln_modulate(x, sh, sc, norm="rms", weight=w),
    ),
    "gated-adaln-per-token": (
        lambda g: (
            _rand(1, 6, 64, g=g),
            _rand(1, 6, 64, g=g),
            *_rand(1, 6, 3, 64, dtype=torch.float32, g=g).unbind(2),
        ),
        lambda x, y, ga, sh, sc: ditfuse.gated_residual_adaln(x, y, ga, sh, sc),
    ),
    "gated-residual": (
        lambda g: (_rand(2, 5, 32, g=g), _rand(2, 5, 32, g=g), _rand(2, 32, g=g)),
        lambda x, y, ga: ditfuse.gated_residual(x, y, ga, rounding="per_op"),
    ),
    "chunked-d": (
        lambda g: (_rand(1, 2, 9000, g=g), _rand(1, 9000, dtype=torch.float32, g=g)),
        lambda x, sh: ditfuse.adaln_modulate(x, sh, None, norm="layer"),
    ),
}


@pytest.mark.parametrize("case", list(ADALN_CASES))
@torch.no_grad()
def test_adaln_replay(case, replays):
    make, op = ADALN_CASES[case]
    _twice(make, op, replays)
    assert len(adaln._CACHE) == 1


@torch.no_grad()
def test_adaln_inplace_and_out_x(replays):
    def inplace(x, y, ga, sh, sc):
        x0 = x.clone()
        xn, m = ditfuse.gated_residual_adaln(x, y, ga, sh, sc, inplace=True)
        assert xn is x and not torch.equal(x, x0)
        return x, m

    def make(g):
        return (_rand(2, 4, 32, g=g), _rand(2, 4, 32, g=g), *_rand(2, 3 * 32, g=g).chunk(3, 1))

    _twice(make, inplace, replays)

    def out_x(x, y, ga):
        r = ditfuse.gated_residual(x, y, ga, out=x)
        assert r is x
        return x.clone()

    _twice(
        lambda g: (_rand(2, 4, 32, g=g), _rand(2, 4, 32, g=g), _rand(2, 32, g=g)), out_x, replays
    )
    # a later call with a distinct out of the same signature must not write into x
    g = torch.Generator().manual_seed(5)
    x, y, ga = _rand(2, 4, 32, g=g), _rand(2, 4, 32, g=g), _rand(2, 32, g=g)
    x0, out = x.clone(), torch.full_like(x, float("nan"))
    ditfuse.gated_residual(x, y, ga, out=out)
    assert torch.equal(x, x0)
    _equal(out, _checked(lambda: ditfuse.gated_residual(x, y, ga)))


@torch.no_grad()
def test_aliased_record_then_distinct(replays):
    """y is x when the signature is first seen: nothing is cached (slots ambiguous); a
    distinct call then records, and an aliased call replays correctly from it."""
    g = torch.Generator().manual_seed(2)
    x, ga = _rand(2, 3, 16, g=g), _rand(2, 16, g=g)
    r1 = ditfuse.gated_residual(x, x, ga)
    assert len(adaln._CACHE) == 0
    _equal(r1, _checked(lambda: ditfuse.gated_residual(x, x, ga)))
    y = _rand(2, 3, 16, g=g)
    ditfuse.gated_residual(x, y, ga)
    assert len(adaln._CACHE) == 1
    n = replays[0]
    r2 = ditfuse.gated_residual(y, y, ga)
    assert replays[0] == n + 1
    _equal(r2, _checked(lambda: ditfuse.gated_residual(y, y, ga)))


@torch.no_grad()
def test_signature_change_misses(replays):
    g = torch.Generator().manual_seed(3)
    base = _rand(2, 6, 40, g=g)
    sh = _rand(2, 40, g=g)
    ditfuse.adaln_modulate(base, sh, None)
    n = replays[0]
    for x in (
        base[:, :5],
        base.transpose(0, 1).contiguous().transpose(0, 1),
        base.float(),
        _rand(2, 6, 41, g=g)[..., 1:],
    ):  # fewer tokens, strides, dtype, alignment
        s = sh if x.dtype == sh.dtype else sh.float()
        r = ditfuse.adaln_modulate(x, s, None)
        _equal(r, _checked(lambda: ditfuse.adaln_modulate(x, s, None)))
    assert replays[0] == n
    assert len(adaln._CACHE) == 5


@torch.no_grad()
def test_activation_replay(replays):
    def gelu_into(h, first):
        buf = torch.full(
            (*h.shape[:-1], first.shape[-1] + h.shape[-1]),
            float("nan"),
            dtype=h.dtype,
            device=h.device,
        )
        buf[..., : first.shape[-1]].copy_(first)
        ditfuse.gelu(h, "tanh", out=buf[..., first.shape[-1] :])
        return buf

    _twice(lambda g: (_rand(2, 5, 96, g=g), _rand(2, 5, 32, g=g)), gelu_into, replays)
    _twice(lambda g: (_rand(3, 7, 64, g=g),), ditfuse.swiglu, replays)
    _twice(lambda g: (_rand(4, 50, g=g),), lambda h: ditfuse.gelu(h, "none"), replays)


GN_LAUNCH = {"fit": None, "split": dict(fit_max=0, tile=16)}


@pytest.mark.parametrize("path", list(GN_LAUNCH))
@torch.no_grad()
def test_group_norm_replay(path, replays, monkeypatch):
    """Both paths, the split path's partials made afresh for each replay: NaN partials and
    NaN outputs; out= a channel slice; the channel RMS norm too."""
    monkeypatch.setattr(
        gn,
        "_partials",
        lambda n, device: torch.full((4 * n,), float("nan"), dtype=torch.float32, device=device),
    )
    monkeypatch.setattr(gn, "_out_like", lambda x: torch.full_like(x, float("nan")))
    launch = GN_LAUNCH[path]
    _twice(
        lambda g: (_rand(2, 8, 3, 5, g=g), _rand(8, g=g), _rand(8, g=g)),
        lambda x, w, b: ditfuse.group_norm_silu(x, 4, w, b, _launch=launch),
        replays,
    )
    _twice(
        lambda g: (_rand(1, 6, 2, 3, 4, dtype=torch.float16, g=g),),
        lambda x: ditfuse.group_norm_silu(x, 2, eps=1e-5, silu=False, _launch=launch),
        replays,
    )

    def into(x, w):
        buf = torch.full((2, 12, 3, 5), float("nan"), dtype=x.dtype, device=x.device)
        ditfuse.group_norm_silu(x, 4, w, None, out=buf[:, 2:10], _launch=launch)
        assert torch.isnan(buf[:, :2]).all() and torch.isnan(buf[:, 10:]).all()
        return buf[:, 2:10]

    _twice(lambda g: (_rand(2, 8, 3, 5, g=g), _rand(8, dtype=torch.float32, g=g)), into, replays)
    assert len(gn._CACHE) == 3
    # in place: x and out alias, never cached
    _twice(
        lambda g: (_rand(2, 8, 3, 5, g=g),),
        lambda x: ditfuse.group_norm_silu(x, 4, out=x, _launch=launch),
        replays,
        expect_replay=False,
    )
    _twice(
        lambda g: (_rand(2, 8, 3, 5, g=g), _rand(8, 1, 1, g=g)),
        lambda x, gm: ditfuse.rms_norm_silu_channels(x, gm, 0.0),
        replays,
    )


def _qk_make(H, D, S, norm_kind, form):
    def make(g):
        q, k = _rand(2, S, H, D, g=g), _rand(2, S, H, D, g=g)
        c, s = rope_tables(S, D)
        if form == "flat":
            q, k = q.flatten(2), k.flatten(2)
        return q, k, c, s

    return make


@pytest.mark.parametrize("form", [pytest.param("bshd", marks=pytest.mark.slow), "flat"])
@torch.no_grad()
def test_qk_replay(form, replays, poison_outputs):
    H, D, S = 3, 32, 5
    g = torch.Generator().manual_seed(4)
    nq = torch.nn.RMSNorm(D, eps=1e-6).to(DEVICE, torch.bfloat16)
    nk = torch.nn.RMSNorm(D, eps=1e-6).to(DEVICE, torch.bfloat16)
    nq.weight.data.copy_(_rand(D, g=g))
    nk.weight.data.copy_(_rand(D, g=g))
    kw = dict(q_norm=nq, k_norm=nk, num_heads=H if form == "flat" else None)
    _twice(
        _qk_make(H, D, S, "rms", form),
        lambda q, k, c, s: ditfuse.qk_norm_rope(q, k, c, s, **kw),
        replays,
    )
    # a new weight tensor on the module: still the module's current weight
    nq.weight = torch.nn.Parameter(_rand(D, g=g), requires_grad=False)
    _twice(
        _qk_make(H, D, S, "rms", form),
        lambda q, k, c, s: ditfuse.qk_norm_rope(q, k, c, s, **kw),
        replays,
    )

    def into(q, k, c, s):  # slices of a text + image buffer, as the FLUX patch writes
        buf_q = torch.full((2, S + 2, *q.shape[2:]), float("nan"), dtype=q.dtype, device=q.device)
        buf_k = torch.full_like(buf_q, float("nan"))
        ditfuse.qk_norm_rope(q, k, c, s, out=(buf_q[:, 2:], buf_k[:, 2:]), **kw)
        return buf_q[:, 2:], buf_k[:, 2:]

    _twice(_qk_make(H, D, S, "rms", form), into, replays)

    def inplace(q, k, c, s):
        ditfuse.qk_norm_rope(q, k, c, s, inplace=True, **kw)
        return q, k

    _twice(_qk_make(H, D, S, "rms", form), inplace, replays)


@torch.no_grad()
def test_qk_without_k_and_norms(replays):
    _twice(
        lambda g: (_rand(1, 4, 2, 16, g=g), *rope_tables(4, 16)),
        lambda q, c, s: ditfuse.qk_norm_rope(q, None, c, s),
        replays,
    )


@torch.no_grad()
def test_cache_off_records_nothing(replays):
    g = torch.Generator().manual_seed(6)
    x, y = _rand(1, 3, 16, g=g), _rand(1, 3, 16, g=g)
    _checked(lambda: (ditfuse.gated_residual(x, y), ditfuse.gated_residual(x, y)))
    assert len(adaln._CACHE) == 0 and replays[0] == 0


@torch.no_grad()
def test_nested_recording_keeps_inner_launches(replays):
    """An op run inside another op's recording adds its launches to the outer one and does
    not replay (a replay would hide them from the outer recording)."""
    g = torch.Generator().manual_seed(7)
    x, y = _rand(1, 3, 16, g=g), _rand(1, 3, 16, g=g)
    ditfuse.gated_residual(x, y)  # cached
    with _fastpath.Recorder() as outer:
        ditfuse.gated_residual(x, y)
        ditfuse.gelu(y)
    assert replays[0] == 0
    assert len(outer.launches) == 2


def test_every_cached_launch_is_recorded():
    """The ops with a cache launch kernels only through ``fastpath.launch``: a direct
    ``kernel[grid](...)`` inside a recorded call would be missing from its replay."""
    src = Path(ditfuse.__file__).parent / "ops"
    for name in ("adaln.py", "activations.py", "qk_norm_rope.py", "group_norm.py", "attention.py"):
        text = (src / name).read_text()
        assert not re.search(r"_kernel\s*\[", text), name


@torch.no_grad()
def test_recording_is_per_thread(replays):
    """A recording on one thread neither sees another thread's launches nor stops its
    replays."""
    import threading

    g = torch.Generator().manual_seed(8)
    x, y = _rand(1, 3, 16, g=g), _rand(1, 3, 16, g=g)
    ditfuse.gated_residual(x, y)  # cached
    seen = {}

    def other():
        n = replays[0]
        seen["out"] = ditfuse.gated_residual(x, y)
        seen["replayed"] = replays[0] == n + 1

    with _fastpath.Recorder() as rec:
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert rec.launches == [] and seen["replayed"]
    _equal(seen["out"], _checked(lambda: ditfuse.gated_residual(x, y)))


def _same_proj(B, N, H, D, dtype=torch.bfloat16):
    """q1, q2, k1, k2, v as views of one packed projection (SAME's ``to_qkv(x).chunk(5)``)."""

    def make(g):
        proj = _rand(B, N, 5 * H * D, dtype=dtype, g=g)
        return tuple(t.unflatten(-1, (H, D)) for t in proj.chunk(5, dim=-1))

    return make


def _dyt(D, g):
    return NormSpec(
        "dyt",
        weight=_rand(D, g=g) * 0.3 + 1,
        bias=_rand(D, g=g) * 0.1,
        alpha=torch.tensor([0.7], dtype=torch.bfloat16, device=DEVICE),
        eps=None,
    )


@pytest.mark.slow
@torch.no_grad()
def test_attention_replay(replays, monkeypatch):
    """sliding_window_attention: differential on views of a packed projection (SAME-L's
    table entry, with its register cap), bhsd with an asymmetric window, the DyT + RoPE
    prologue with a per-head lam, RMSNorm modules with a one-element lam; outputs
    NaN-poisoned. A changed lam, window or launch
    table misses."""
    monkeypatch.setattr(
        attn_mod,
        "_new_out",
        lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device),
    )
    B, N, H, D = 2, 21, 2, 64
    _twice(
        _same_proj(B, N, H, D),
        lambda q1, q2, k1, k2, v: ditfuse.sliding_window_attention(
            q1, k1, v, 17, q2=q2, k2=k2, lam=0.8
        ),
        replays,
    )
    # fp32 (on sm_90: the fp32 Gluon kernel, its descriptors rebuilt at replay)
    _twice(
        _same_proj(1, 70, 3, D, torch.float32),
        lambda q1, q2, k1, k2, v: ditfuse.sliding_window_attention(
            q1, k1, v, 17, q2=q2, k2=k2, lam=0.8
        ),
        replays,
    )
    _twice(
        lambda g: tuple(_rand(1, 3, 13, 32, g=g) for _ in range(3)),
        lambda q, k, v: ditfuse.sliding_window_attention(q, k, v, (3, -1), layout="bhsd"),
        replays,
    )
    g = torch.Generator().manual_seed(9)
    qn, kn = _dyt(D, g), _dyt(D, g)
    lam = _rand(H, dtype=torch.float32, g=g)
    c, s = rope_tables(N, 32, style="half")
    kw = dict(q_norm=qn, k_norm=kn, cos=c, sin=s, rotary_dim=32)
    _twice(
        _same_proj(1, N, H, D),
        lambda q1, q2, k1, k2, v: ditfuse.sliding_window_attention(
            q1, k1, v, 5, q2=q2, k2=k2, lam=lam, **kw
        ),
        replays,
    )
    # norms as modules (torch's RMSNorm per head), a one-element lam tensor
    nq, nk = (torch.nn.RMSNorm(D, eps=1e-6).to(DEVICE, torch.bfloat16) for _ in range(2))
    nq.weight.data.copy_(_rand(D, g=g))
    nk.weight.data.copy_(_rand(D, g=g))
    lam1 = _rand(1, dtype=torch.float32, g=g)
    _twice(
        _same_proj(B, N, H, D),
        lambda q1, q2, k1, k2, v: ditfuse.sliding_window_attention(
            q1, k1, v, (4, 9), q2=q2, k2=k2, lam=lam1, q_norm=nq, k_norm=nk
        ),
        replays,
    )
    # same tensors, another lam / window / table: new signatures, no replay
    q1, q2, k1, k2, v = _same_proj(B, N, H, D)(g)
    for call in (
        lambda: ditfuse.sliding_window_attention(q1, k1, v, 17, q2=q2, k2=k2, lam=0.5),
        lambda: ditfuse.sliding_window_attention(q1, k1, v, 16, q2=q2, k2=k2, lam=0.8),
    ):
        n = replays[0]
        _equal(call(), _checked(call))
        assert replays[0] == n
    monkeypatch.setattr(
        attn_mod, "launch_settings", lambda *a, **k: attn_mod.Settings(64, 16, 4, 1)
    )
    call = lambda: ditfuse.sliding_window_attention(q1, k1, v, 17, q2=q2, k2=k2, lam=0.8)  # noqa: E731
    n = replays[0]
    _equal(call(), _checked(call))
    assert replays[0] == n


def test_descriptor_args_rebased_at_replay():
    """A TMA descriptor argument (the sm_90 Gluon attention's) replays over the new call's
    tensor in its slot: the recorded view's shape / strides, the new tensor's address; a
    descriptor over a tensor outside the call's slots cannot replay."""
    from dataclasses import dataclass

    @dataclass
    class Desc:  # stands in for triton's TensorDescriptor (a dataclass over ``base``)
        base: torch.Tensor
        shape: list
        strides: list

    seen = []

    class Kernel:
        params = None

        def __getitem__(self, grid):
            return lambda *args, **kw: seen.append(args)

    a, out = torch.randn(2, 8, 3, 4), torch.empty(2, 8, 3, 4)
    view = a.transpose(1, 2)  # the launcher's view of the call's tensor: same address
    with _fastpath.Recorder() as rec:
        _fastpath.launch(
            Kernel(), (1,), (Desc(view, list(view.shape), list(view.stride())), out, 7), {}
        )
    rep = rec.replay((a, out))
    assert rep is not None
    a2, out2 = torch.randn(2, 8, 3, 4), torch.empty(2, 8, 3, 4)
    seen.clear()
    interp = _fastpath.INTERPRET
    try:
        _fastpath.INTERPRET = True  # the replay's Python launch path (no compiled launcher)
        assert rep((a2, out2))
    finally:
        _fastpath.INTERPRET = interp
    ((d, o, n),) = seen
    assert d.base is a2 and d.shape == list(view.shape) and d.strides == list(view.stride())
    assert o is out2 and n == 7
    with _fastpath.Recorder() as rec:
        _fastpath.launch(Kernel(), (1,), (Desc(torch.randn(3), [3], [1]), out, 7), {})
    assert rec.replay((a, out)) is None
