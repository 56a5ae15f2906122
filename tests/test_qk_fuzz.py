"""qk_norm_rope over randomly drawn combinations of the arguments that the parametrised
tests hold apart: token counts from 1, odd head counts, head_dims that are not powers of
two, Q and K with different norms, no K, partial rotary widths, every table form, the
normalised value rounded or kept in fp32 (``round_after_norm``), outputs in place / new /
into strided slices of a larger buffer, batch > 1, and grad mode on with
nothing requiring grad. Each case against the float64 reference, every element, outputs
poisoned first. ``DITFUSE_FUZZ_N`` cases (default 40), reproducible from the case number.
"""

import os
import random

import pytest
import torch
from conftest import DTYPES, assert_close_report, fuzz_cases
from test_qk_norm_rope import make_norm, make_qk, make_tables

import ditfuse

N_CASES = int(os.environ.get("DITFUSE_FUZZ_N", "40"))
NORMS = ["rms", "rms_noaffine", "layer", "dyt", "rms_roundw", None]
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
HEAD_DIMS = [16, 32, 48, 64, 80, 96, 128, 160, 256]


def draw(i):
    r = random.Random(1000 + i)
    D = r.choice(HEAD_DIMS)
    H = r.choice([1, 2, 3, 5, 7]) if D <= 128 else r.choice([1, 2, 3])
    c = dict(
        i=i,
        dtype=r.choice(DTYPES),
        B=r.choice([1, 1, 2, 3]),
        S=r.choice([1, 2, 3, 7, 17, 33]),
        H=H,
        D=D,
        span=r.choice(["head", "all"]),
        q_norm=r.choice(NORMS),
        k_norm=r.choice(NORMS),
        has_k=r.random() < 0.8,
        style=r.choice(["interleaved", "half", None]),
        partial=r.random() < 0.3,
        table=r.choice(TABLES),
        form=r.choice(["bshd", "bhsd", "flat", "packed", "strided_d"]),
        dest=r.choice(["new", "inplace", "out_slices"]),
        grad_mode=r.random() < 0.3,
        seed=r.randrange(2**31),
        round_after_norm=r.random() < 0.8,
    )
    if c["table"] in ("B,S,W", "S,H,W") and c["S"] == H:
        # a 3-D table that reads as both forms is refused (test_qk_errors): its 4-D form
        c["table"] = {"B,S,W": "B,S,1,W", "S,H,W": "B,S,H,W"}[c["table"]]
    if c["span"] == "all" and (c["q_norm"] is None or c["k_norm"] is None):
        c["span"] = "head"  # a norm across heads on one side only is a different op
    return c


@pytest.mark.parametrize("i", fuzz_cases(N_CASES))
def test_fuzz_against_fp64_reference(i, poison_outputs):
    c = draw(i)
    g = torch.Generator().manual_seed(c["seed"])
    B, S, H, D, dtype = c["B"], c["S"], c["H"], c["D"], c["dtype"]
    q, k, kw, buf = make_qk(c["form"], B, S, H, D, dtype, g)
    if not c["has_k"]:
        k = None
    qn = make_norm(c["q_norm"], c["span"], H, D, dtype, g)
    kn = make_norm(c["k_norm"], c["span"], H, D, dtype, g) if k is not None else None
    for m in (qn, kn):  # inference weights, as after model.requires_grad_(False)
        if isinstance(m, torch.nn.Module):
            m.requires_grad_(False)
    cos = sin = None
    if c["style"] is not None:
        R = D
        if c["partial"]:
            R = max(2, (D // 2) // 2 * 2)
        cos, sin, tkw = make_tables(c["table"], B, S, H, R, c["style"], g)
        kw.update(tkw, rope_style=c["style"])
    kw["round_after_norm"] = c["round_after_norm"]
    with torch.no_grad():
        ref_q, ref_k = ditfuse.qk_norm_rope_reference(
            q, k, cos, sin, q_norm=qn, k_norm=kn, compute_dtype=torch.float64, **kw
        )
    q_in = q.clone()
    k_in = k.clone() if k is not None else None
    buf_in = buf.clone() if buf is not None else None
    extra = {}
    if c["dest"] == "inplace":
        extra["inplace"] = True
    elif c["dest"] == "out_slices":  # every other channel of a wider, NaN-filled buffer

        def dest(t):
            if t is None:
                return None
            wide = torch.full(
                t.shape[:-1] + (2 * t.shape[-1],), float("nan"), dtype=t.dtype, device=t.device
            )
            return wide[..., ::2] if t.dim() == 4 else wide[..., : t.shape[-1]]

        extra["out"] = (dest(q), dest(k))
    with torch.set_grad_enabled(c["grad_mode"]):
        out_q, out_k = ditfuse.qk_norm_rope(q, k, cos, sin, q_norm=qn, k_norm=kn, **kw, **extra)
    if c["dest"] == "inplace":
        assert out_q.data_ptr() == q.data_ptr()
    else:
        assert torch.equal(q, q_in), "q changed without inplace"
        if k is not None:
            assert torch.equal(k, k_in), "k changed without inplace"
    if c["dest"] == "out_slices":
        assert out_q.data_ptr() == extra["out"][0].data_ptr()
    assert_close_report(out_q, ref_q, dtype, f"q {c}")
    if k is None:
        assert out_k is None
    else:
        assert_close_report(out_k, ref_k, dtype, f"k {c}")
    if buf is not None:  # V and the pad channels of a packed projection untouched
        HD = H * D
        assert torch.equal(buf[..., 2 * HD :], buf_in[..., 2 * HD :])
