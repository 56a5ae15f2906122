"""sliding_window_attention over randomly drawn combinations of what the parametrised tests
hold apart: token counts from 1 (below, at and above the tile), odd head counts, symmetric
and (left, right) windows with unbounded sides, the differential form with a float or
per-head lambda, both layouts, chunks of one packed projection, an explicit scale, the fused
prologue (norm kinds x rotary style x partial / unique tables), head dims that are not a
power of two (padded tiles), 16-token tiles (storing all 16 queries, the table's query
step or any count) and production tiles, grad mode on with nothing requiring grad. Each case
against the float64 dense-mask reference with the tolerance of ``test_attention.py``.
``DITFUSE_FUZZ_N`` cases (default 16), reproducible from the case number.
"""

import os
import random

import pytest
import torch
from conftest import fuzz_cases
from test_attention import DEVICE, DTYPES, SMALL, check, rnd, same_tables

from ditfuse import sliding_window_attention_reference as reference
from ditfuse.norms import NormSpec
from ditfuse.ops import attention as A

N_CASES = int(os.environ.get("DITFUSE_FUZZ_N", "16"))


def draw(i):
    r = random.Random(5000 + i)
    side = lambda: r.choice([-1, 0, 1, 2, 5, 17, 40])  # noqa: E731
    c = dict(
        dtype=r.choice(DTYPES),
        B=r.choice([1, 2]),
        N=r.choice([1, 2, 15, 16, 17, 33, 70]),
        H=r.choice([1, 2, 3]),
        D=r.choice([32, 64, 128]),
        window=r.choice([r.choice([0, 1, 3, 17, -1]), (side(), side())]),
        diff=r.random() < 0.5,
        lam=r.choice(["float", "per-head"]),
        layout=r.choice(["bshd", "bhsd"]),
        packed=r.random() < 0.4,
        scale=r.choice([None, None, 0.3]),
        norm=r.choice([None, None, "rms", "dyt", "layer"]),
        rope=r.choice([None, "half", "interleaved"]),
        partial=r.random() < 0.5,
        unique=r.random() < 0.3,
        small=r.random() < 0.7,
        grad_mode=r.random() < 0.3,
        seed=r.randrange(2**31),
    )
    if r.random() < 0.3:  # a head dim that is not a power of two (padded tiles)
        c["D"] = r.choice([8, 16, 48, 80, 96])
    # the queries a 16-token program stores (its own generator: the draws above stay those
    # each case number had before this draw was added): all 16, the table's query step, or
    # any count
    c["step"] = random.Random(9000 + i).choice([None, None, "table", 1, 7, 13, 15])
    return c


def _small_settings(c):
    step = c["step"]
    if step == "table":
        w = c["window"]
        left, right = (w, w) if isinstance(w, int) else w
        step = (
            A.query_step(SMALL[0], SMALL[1], min(left, c["N"]), min(right, c["N"]))
            if left >= 0 and right >= 0
            else None
        )
    return tuple(SMALL) + (None, None, step)


def _norm(g, kind, D, dtype):
    if kind == "rms":
        return NormSpec("rms", weight=rnd(g, D, dtype=dtype, scale=0.2) + 1, eps=1e-6)
    if kind == "dyt":
        return NormSpec(
            "dyt",
            weight=rnd(g, D, dtype=dtype, scale=0.3) + 1,
            bias=rnd(g, D, dtype=dtype, scale=0.1),
            alpha=torch.tensor([0.7], dtype=dtype, device=DEVICE),
            eps=None,
        )
    if kind == "layer":
        return NormSpec("layer", eps=1e-5)
    return None


@pytest.mark.parametrize("i", fuzz_cases(N_CASES))
def test_fuzz_against_fp64_reference(i, monkeypatch):
    c = draw(i)
    if c["small"]:
        st = _small_settings(c)
        monkeypatch.setattr(A, "launch_settings", lambda *a, **k: st)
    g = torch.Generator().manual_seed(c["seed"])
    B, N, H, D, dtype = c["B"], c["N"], c["H"], c["D"], c["dtype"]
    n = 5 if c["diff"] else 3
    if c["packed"]:  # chunks of one projection, as SAME's to_qkv: strided views
        proj = rnd(g, B, N, n * H * D, dtype=dtype)
        parts = [t.unflatten(-1, (H, D)) for t in proj.chunk(n, dim=-1)]
    else:
        parts = [rnd(g, B, N, H, D, dtype=dtype) for _ in range(n)]
    if c["layout"] == "bhsd":
        parts = [t.transpose(1, 2) for t in parts]
    if c["diff"]:
        q, q2, k, k2, v = parts
    else:
        (q, k, v), q2, k2 = parts, None, None
    kw = dict(layout=c["layout"], scale=c["scale"])
    if c["diff"]:
        kw.update(
            q2=q2,
            k2=k2,
            lam=0.8 if c["lam"] == "float" else torch.linspace(-0.5, 1.2, H, device=DEVICE),
        )
    if c["norm"]:
        kw.update(q_norm=_norm(g, c["norm"], D, dtype), k_norm=_norm(g, c["norm"], D, dtype))
    if c["rope"]:
        R = D // 2 if c["partial"] else D
        cos, sin = same_tables(N, R)
        if c["rope"] == "interleaved":
            cos, sin = (t[:, : R // 2].repeat_interleave(2, -1) for t in (cos, sin))
        if c["unique"]:
            cos, sin = (
                t[:, 0::2] if c["rope"] == "interleaved" else t[:, : R // 2] for t in (cos, sin)
            )
        kw.update(cos=cos, sin=sin, rope_style=c["rope"], rotary_dim=R)
    before = [t.clone() for t in parts]
    with torch.set_grad_enabled(c["grad_mode"]):
        out = A.sliding_window_attention(q, k, v, c["window"], **kw)
    with torch.no_grad():
        ref = reference(q, k, v, c["window"], compute_dtype=torch.float64, **kw)
    for b, t in zip(before, parts):
        assert torch.equal(b, t), "an input changed"
    lam = kw.get("lam", 0.0)
    check(out, ref, v, dtype, f"case{i} {c}", lam=lam)
