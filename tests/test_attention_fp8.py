"""ditfuse.attention: the 8-bit path (kernel under the interpreter on the CPU, compiled on
sm_90), its PyTorch emulation, the 16-bit front door, bad inputs and the sm_90 builds."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE

import ditfuse
from ditfuse.ops import attention_api as API
from ditfuse.ops import attention_fp8 as A
from ditfuse.reference import attention_8bit_core, quantize_per_token, quantize_v_e4m3
from ditfuse.tolerances import (
    ATTENTION_8BIT_COS_MIN,
    ATTENTION_8BIT_E4M3_QK_COS_MIN,
    ATTENTION_8BIT_E4M3_QK_REL_L2_MAX,
    ATTENTION_8BIT_REL_L2_MAX,
    ATTENTION_8BIT_VS_EMULATION,
)

# Accuracy of 8-bit attention against float64 on the same inputs (the target; CPU
# emulation of the scheme measures 0.9993-0.9995 / 0.033-0.036 on random normal inputs)
COS_MIN = ATTENTION_8BIT_COS_MIN
REL_L2_MAX = ATTENTION_8BIT_REL_L2_MAX
# kernel vs its PyTorch emulation: same operands, P rounded to e4m3 against the running
# rather than the final row max and other summation orders (measured <= 0.015 at D 64)
KERNEL_VS_EMULATION = ATTENTION_8BIT_VS_EMULATION

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def metrics(out, ref):
    o, r = out.double().flatten(), ref.double().flatten()
    return (o @ r / (o.norm() * r.norm())).item(), ((o - r).norm() / r.norm()).item()


def reference64(q, k, v, window=None, scale=None, layout="bshd", key_mask=None):
    """Softmax attention in float64 on the 16-bit inputs, (B, S, H, D) out."""
    if layout == "bhsd":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    qd, kd, vd = (x.double().transpose(1, 2) for x in (q, k, v))
    s = qd @ kd.transpose(-1, -2) * (scale or 1 / math.sqrt(q.shape[-1]))
    if window is not None:
        left, right = window if isinstance(window, tuple) else (window, window)
        i = torch.arange(q.shape[1], device=q.device)[:, None]
        j = torch.arange(k.shape[1], device=q.device)[None]
        keep = torch.ones_like(i - j, dtype=torch.bool)
        if left >= 0:
            keep &= j >= i - left
        if right >= 0:
            keep &= j <= i + right
        s = s.masked_fill(~keep, float("-inf"))
    if key_mask is not None:
        s = s.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    return (s.softmax(-1) @ vd).transpose(1, 2)


def inputs(B, Sq, Skv, H, D, kind="randn", dtype=torch.bfloat16, device=DEVICE):
    q = torch.randn(B, Sq, H, D, dtype=dtype, device=device)
    k = torch.randn(B, Skv, H, D, dtype=dtype, device=device)
    v = torch.randn(B, Skv, H, D, dtype=dtype, device=device)
    if kind == "rmsnorm":  # Q/K after an RMSNorm with per-channel weights (outlier channels)
        w = (1 + 0.5 * torch.randn(D, device=device)).abs() + 0.1
        q = (F.rms_norm(q.float(), (D,)) * w).to(dtype)
        k = (F.rms_norm(k.float(), (D,)) * w).to(dtype)
    return q, k, v


def quantized(q, k, fmt="int8", layout="bshd"):
    q8, qs = quantize_per_token(q, fmt, layout=layout)
    k8, ks = quantize_per_token(k, fmt, layout=layout)
    return q8, k8, qs, ks


@pytest.fixture
def poisoned(monkeypatch):
    """Outputs filled with NaN before the kernel writes them: an element it skips fails."""

    def new(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(A, "_new_out", new)


CASES = [
    # B, S_q, S_kv, H, D, window, layout
    (1, 200, 200, 2, 64, None, "bshd"),
    (2, 77, 150, 1, 128, None, "bshd"),  # tails: neither length a multiple of a tile
    (1, 300, 300, 2, 64, (37, 5), "bshd"),  # a band
    (1, 130, 130, 2, 128, (-1, 0), "bhsd"),  # causal as a band, (B, H, S, D)
    (1, 257, 257, 1, 64, (16, -1), "bshd"),
]


@pytest.mark.parametrize(
    "case", CASES, ids=[f"{c[1]}x{c[2]}-h{c[3]}-d{c[4]}-w{c[5]}-{c[6]}" for c in CASES]
)
def test_kernel_accuracy_and_emulation(case, poisoned):
    B, Sq, Skv, H, D, window, layout = case
    q, k, v = inputs(B, Sq, Skv, H, D)
    if layout == "bhsd":
        q, k, v = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    q8, k8, qs, ks = quantized(q, k, layout=layout)
    out = ditfuse.attention(
        q8, k8, v, precision="fp8", q_scale=qs, k_scale=ks, window=window, layout=layout
    )
    assert out.shape == q.shape and out.dtype == v.dtype
    assert torch.isfinite(out).all()
    o4 = out if layout == "bshd" else out.transpose(1, 2)
    cos, rel = metrics(o4, reference64(q, k, v, window, layout=layout))
    assert cos >= COS_MIN and rel <= REL_L2_MAX, (cos, rel)
    p = A.plan(q8, k8, v, q_scale=qs, k_scale=ks, window=window, layout=layout)
    emu = attention_8bit_core(
        p.q, p.k, p.v, p.q_scale, p.k_scale, scale=p.scale, left=p.left, right=p.right
    )
    assert metrics(o4, emu)[1] <= KERNEL_VS_EMULATION


@pytest.mark.parametrize("kind", ["randn", pytest.param("rmsnorm", marks=pytest.mark.slow)])
def test_16bit_inputs_quantized_by_the_op(kind, poisoned):
    """16-bit q / k go through the prologue (no norm, no RoPE) and give the same output as
    the same call on the prologue's int8 + scales -- where one kernel takes both: on sm_90
    the 16-bit call runs the warp-specialized kernel (K a 128-key tile after its mean,
    ``test_attention_fp8_ws.py``), and both are checked against float64."""
    q, k, v = inputs(1, 160, 160, 2, 128, kind)
    out = ditfuse.attention(q, k, v, precision="fp8")
    qq = ditfuse.qk_norm_rope(q, k, quantize="int8")
    again = ditfuse.attention(
        qq.q, qq.k, v, precision="fp8", q_scale=qq.q_scale, k_scale=qq.k_scale
    )
    ref = reference64(q, k, v)
    if not API._ws_ok(q, k, None):
        assert torch.equal(out, again)
    for o in (out, again):
        cos, rel = metrics(o, ref)
        assert cos >= COS_MIN and rel <= REL_L2_MAX, (cos, rel)


def test_e4m3_qk(poisoned):
    """e4m3 q / k (what quantize="fp8" writes) run the e4m3 Q K^T; coarser than int8."""
    q, k, v = inputs(1, 150, 150, 2, 64)
    q8, k8, qs, ks = quantized(q, k, "fp8")
    out = ditfuse.attention(q8, k8, v, precision="fp8", q_scale=qs, k_scale=ks)
    p = A.plan(q8, k8, v, q_scale=qs, k_scale=ks)
    emu = attention_8bit_core(p.q, p.k, p.v, p.q_scale, p.k_scale, scale=p.scale)
    assert metrics(out, emu)[1] <= KERNEL_VS_EMULATION
    cos, rel = metrics(out, reference64(q, k, v))
    assert cos >= ATTENTION_8BIT_E4M3_QK_COS_MIN and rel <= ATTENTION_8BIT_E4M3_QK_REL_L2_MAX


def test_strided_inputs_and_scale(poisoned):
    """q / k / v as slices of one packed projection (no copy) and a custom softmax scale."""
    B, S, H, D = 1, 140, 2, 64
    qkv = torch.randn(B, S, 3, H, D, dtype=torch.bfloat16, device=DEVICE)
    q, k, v = qkv.unbind(2)
    q8, k8, qs, ks = quantized(q, k)
    big = torch.empty(B, S, H, 2 * D, dtype=torch.int8, device=DEVICE)
    big[..., :D] = q8
    qv = big[..., :D]  # a strided int8 view
    out = ditfuse.attention(qv, k8, v, precision="fp8", q_scale=qs, k_scale=ks, scale=0.2)
    ref = ditfuse.attention(q8, k8, v, precision="fp8", q_scale=qs, k_scale=ks, scale=0.2)
    assert torch.equal(out, ref)
    assert metrics(out, reference64(q, k, v, scale=0.2))[0] >= COS_MIN


def test_strided_scales(poisoned):
    """Scales read through their strides (a slice of a wider buffer), never copied."""
    q, k, v = inputs(1, 100, 100, 2, 64)
    q8, k8, qs, ks = quantized(q, k)
    wide = torch.randn(2, 1, 2, 128, device=DEVICE)
    wide[0, :, :, 5:105] = qs
    wide[1, :, :, 5:105] = ks
    qv, kv = wide[0, :, :, 5:105], wide[1, :, :, 5:105]
    assert not qv.is_contiguous()
    out = ditfuse.attention(q8, k8, v, precision="fp8", q_scale=qv, k_scale=kv)
    assert torch.equal(out, ditfuse.attention(q8, k8, v, precision="fp8", q_scale=qs, k_scale=ks))


def test_key_mask(poisoned):
    """Text-padding masks: HunyuanVideo's (video + the valid text tokens: a prefix of each
    batch entry's keys) and Qwen-Image's (text first, its padding in the middle); the
    16-bit path takes the same mask through SDPA."""
    B, S, H, D = 2, 190, 2, 64
    q, k, v = inputs(B, S, S, H, D)
    j = torch.arange(S, device=DEVICE)
    prefix = j[None] < torch.tensor([150, 171], device=DEVICE)[:, None]
    middle = (j[None] >= 40) | (j[None] < torch.tensor([17, 33], device=DEVICE)[:, None])
    q8, k8, qs, ks = quantized(q, k)
    for mask in (prefix, middle):
        out = ditfuse.attention(q8, k8, v, precision="fp8", q_scale=qs, k_scale=ks, key_mask=mask)
        ref = reference64(q, k, v, key_mask=mask)
        cos, rel = metrics(out, ref)
        assert cos >= COS_MIN and rel <= REL_L2_MAX, (cos, rel)
        p = A.plan(q8, k8, v, q_scale=qs, k_scale=ks, key_mask=mask)
        emu = attention_8bit_core(p.q, p.k, p.v, p.q_scale, p.k_scale, scale=p.scale, key_mask=mask)
        assert metrics(out, emu)[1] <= KERNEL_VS_EMULATION
        exact = ditfuse.attention(q, k, v, key_mask=mask)
        sdpa = F.scaled_dot_product_attention(
            *(x.transpose(1, 2) for x in (q, k, v)), attn_mask=mask[:, None, None, :]
        ).transpose(1, 2)
        assert torch.equal(exact, sdpa)
    # a batch entry with no key left: zeros, never NaN
    none = prefix.clone()
    none[1] = False
    out = ditfuse.attention(q8, k8, v, precision="fp8", q_scale=qs, k_scale=ks, key_mask=none)
    assert torch.isfinite(out).all() and not out[1].any()
    # with a band
    out = ditfuse.attention(
        q8, k8, v, precision="fp8", q_scale=qs, k_scale=ks, window=20, key_mask=middle
    )
    ref = reference64(q, k, v, window=20, key_mask=middle)
    assert metrics(out, ref)[0] >= COS_MIN


def test_quantize_v_matches_reference():
    """V's e4m3 copy and scales bitwise equal to the reference; a zero channel gets scale 1
    and the padding past S is zero."""
    v = torch.randn(2, 100, 3, 64, dtype=torch.bfloat16, device=DEVICE) * 3
    v[1, :, 2, 5] = 0
    vt, vs = A.quantize_v(v)
    v8, rs = quantize_v_e4m3(v)
    assert torch.equal(vs, rs)
    assert vs[1, 2, 5] == 1.0
    assert vt.shape == (2, 3, 64, 128)
    assert torch.equal(vt[..., :100].view(torch.uint8), v8.permute(0, 2, 3, 1).view(torch.uint8))
    assert not vt[..., 100:].view(torch.uint8).any()


def test_front_door_16bit():
    """precision=None is the exact 16-bit path: SDPA, or the band kernel with a window."""
    q, k, v = inputs(1, 96, 96, 2, 64)
    out = ditfuse.attention(q, k, v)
    ref = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v))).transpose(1, 2)
    assert torch.equal(out, ref)
    band = ditfuse.attention(q, k, v, window=8)
    assert torch.equal(band, ditfuse.sliding_window_attention(q, k, v, 8))


def test_compiled_matches_eager():
    q, k, v = inputs(1, 130, 130, 2, 64)
    q8, k8, qs, ks = quantized(q, k)

    def f(q8, k8, v, qs, ks):
        return ditfuse.attention(q8, k8, v, precision="fp8", q_scale=qs, k_scale=ks)

    eager = f(q8, k8, v, qs, ks)
    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(q8, k8, v, qs, ks)
    assert torch.equal(compiled, eager)


def test_opcheck_8bit_op():
    """The op and its fake agree (shapes, strides, schema) with and without a band / key
    mask, (B, S, H, D) and (B, H, S, D)."""
    op = torch.ops.ditfuse.attention_8bit.default
    q, k, v = inputs(1, 70, 90, 2, 64)
    q8, k8, qs, ks = quantized(q, k)
    km = torch.rand(1, 90) > 0.3
    torch.library.opcheck(op, (q8, k8, v, qs, ks, -1, -1, None, "bshd", km))
    q, k, v = inputs(1, 80, 80, 2, 64)
    q8, k8, qs, ks = quantized(q, k)
    torch.library.opcheck(op, (q8, k8, v, qs, ks, 9, 4, 0.1, "bshd", None))
    tq, tk, tv = (x.transpose(1, 2) for x in (q, k, v))
    q8, k8, qs, ks = quantized(tq, tk, layout="bhsd")
    torch.library.opcheck(op, (q8, k8, tv, qs, ks, -1, 0, None, "bhsd", None))


def test_emulation_fallback_off_the_kernel_device(monkeypatch):
    """Where the kernel cannot run, the emulation answers (same quantization)."""
    q, k, v = inputs(1, 120, 120, 2, 64)
    q8, k8, qs, ks = quantized(q, k)
    monkeypatch.setattr(A, "_kernel_ok", lambda p: False)
    out = ditfuse.attention(q8, k8, v, precision="fp8", q_scale=qs, k_scale=ks)
    p = A.plan(q8, k8, v, q_scale=qs, k_scale=ks)
    emu = attention_8bit_core(p.q, p.k, p.v, p.q_scale, p.k_scale, scale=p.scale)
    assert torch.equal(out, emu)


# ---------------------------------------------------------------------------------------
# bad inputs: rejected before any kernel runs, with the argument named


def _bad(match, **over):
    q, k, v = inputs(1, 64, 64, 2, 64)
    q8, k8, qs, ks = quantized(q, k)
    kw = dict(q=q8, k=k8, v=v, precision="fp8", q_scale=qs, k_scale=ks)
    kw.update(over)
    args = [kw.pop(n) for n in ("q", "k", "v")]
    with pytest.raises((ValueError, TypeError), match=match):
        ditfuse.attention(*args, **kw)


def test_bad_inputs():
    q, k, v = inputs(1, 64, 64, 2, 64)
    q8, k8, qs, ks = quantized(q, k)
    _bad("q_scale is required", q_scale=None)
    _bad("k_scale is required", k_scale=None)
    _bad(r"q_scale must have shape", q_scale=qs[:, :, :-1])
    _bad(r"k_scale.dtype must be torch.float32", k_scale=ks.double())
    _bad("q_scale / k_scale are for 8-bit", q=q, k=k)
    _bad("precision must be", precision="int4")
    _bad("precision must be", precision=8)
    _bad("layout must be", layout="sbhd")
    _bad("share one 8-bit dtype", k=k8.view(torch.float8_e4m3fn))
    _bad(r"v.dtype must be float16 or bfloat16", v=v.float())
    _bad("window needs as many queries as keys", q=q8[:, :32], q_scale=qs[..., :32], window=4)
    _bad("scale must be a positive", scale=-1.0)
    _bad(r"key_mask.dtype must be torch.bool", key_mask=torch.ones(1, 64, device=DEVICE))
    _bad(
        r"key_mask must have shape \(B, S_kv\)",
        key_mask=torch.ones(1, 1, 1, 64, dtype=torch.bool, device=DEVICE),
    )
    _bad("key_mask is on meta", key_mask=torch.ones(1, 64, dtype=torch.bool, device="meta"))
    _bad("k is on meta", k=k8.to("meta"))
    _bad(r"q_scale is on meta", q_scale=qs.to("meta"))
    q96, k96, v96 = inputs(1, 64, 64, 2, 96)
    with pytest.raises(ValueError, match="head_dim"):
        ditfuse.attention(q96, k96, v96, precision="fp8")
    a8, b8, a_s, b_s = quantized(q96, k96)
    with pytest.raises(ValueError, match="head_dim"):
        ditfuse.attention(a8, b8, v96, precision="fp8", q_scale=a_s, k_scale=b_s)
    with pytest.raises(ValueError, match="q_scale / k_scale go with precision='fp8'"):
        ditfuse.attention(q, k, v, q_scale=qs, k_scale=ks)
    # 16-bit q / k: a bad v / window / scale / key_mask fails before the prologue quantizes
    real_quantize = A.quantize_per_token

    def no_prologue(*a, **kw):
        raise AssertionError("q / k were quantized before the arguments were checked")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(A, "quantize_per_token", no_prologue)
        for kw, match in (
            (dict(v=v.float()), "v.dtype"),
            (dict(window=-3), "window"),
            (dict(scale=0.0), "scale must be"),
            (
                dict(key_mask=torch.ones(1, 63, dtype=torch.bool, device=DEVICE)),
                "key_mask must have shape",
            ),
            (dict(v=v[:, :32]), "v must have k's shape"),
        ):
            args = dict(v=v)
            args.update(kw)
            with pytest.raises((ValueError, TypeError), match=match):
                ditfuse.attention(q, k, args.pop("v"), precision="fp8", **args)
    assert A.quantize_per_token is real_quantize
    with pytest.raises(RuntimeError, match="inference-only"):
        ditfuse.attention(q.requires_grad_(), k, v, precision="fp8")


def test_scales_refused_or_harmless(poisoned):
    """q_scale / k_scale: positive and finite (NaN passes: a NaN token's scale); a zero, a
    negative or an infinite one is refused eagerly on the CPU, naming the argument. The kernel
    itself stays NaN-free for a zero scale -- masked scores (band, tail, key mask) are set to
    -inf after the scales multiply, never 0 * -inf -- and gives the emulation's answer: a
    zero query scale attends uniformly over the row's keys."""
    q, k, v = inputs(1, 150, 150, 2, 64)
    q8, k8, qs, ks = quantized(q, k)
    for name, bad in (
        ("q_scale", 0.0),
        ("k_scale", -0.5),
        ("q_scale", math.inf),
        ("k_scale", -math.inf),
    ):
        t = (qs if name == "q_scale" else ks).clone()
        t[0, 1, 7] = bad
        _bad(
            f"{name} must be positive and finite",
            **{name: t[..., :64]},
            **{
                "q_scale" if name == "k_scale" else "k_scale": (ks if name == "q_scale" else qs)[
                    ..., :64
                ]
            },
        )
    mask = torch.rand(1, 150, device=DEVICE) > 0.3
    zq = qs.clone()
    zq[0, 0, ::3] = 0.0
    zk = ks.clone()
    zk[0, 1, 5::4] = 0.0
    for window, key_mask in ((None, None), ((20, 9), None), (None, mask), ((31, -1), mask)):
        p = A.plan(
            q8,
            k8,
            v,
            q_scale=zq,
            k_scale=zk,
            window=window,
            key_mask=key_mask,
            check_scale_values=False,
        )
        out = A.launch(p)
        assert not out.isnan().any(), (window, key_mask is not None)
        emu = attention_8bit_core(
            p.q,
            p.k,
            p.v,
            p.q_scale,
            p.k_scale,
            scale=p.scale,
            left=p.left,
            right=p.right,
            key_mask=key_mask,
        )
        torch.testing.assert_close(out, emu, rtol=0.05, atol=0.05)
        # rows with a zero query scale: every score 0, P the same for every key
        assert metrics(out[0, ::3, 0], emu[0, ::3, 0])[1] <= 2.0**-7


def test_window_side_past_int32(poisoned):
    """A band side at or past the sequence reaches every key: (0, 2^31 - 1) is the causal
    band's mirror (0, -1) -- the same bits -- not a band emptied by an int32 overflow; the
    16-bit band kernel agrees."""
    q, k, v = inputs(1, 300, 300, 1, 64)
    q8, k8, qs, ks = quantized(q, k)
    kw = dict(precision="fp8", q_scale=qs, k_scale=ks)
    for big, unbounded in (
        ((0, 2**31 - 1), (0, -1)),
        ((2**31 - 1, 3), (-1, 3)),
        ((300, 2**31 - 1), None),
    ):
        out = ditfuse.attention(q8, k8, v, window=big, **kw)
        want = ditfuse.attention(q8, k8, v, window=unbounded, **kw)
        assert torch.equal(out, want), big
        exact = ditfuse.attention(q, k, v, window=big)
        cos, rel = metrics(out, exact)
        assert cos >= COS_MIN and rel <= REL_L2_MAX, (big, cos, rel)


def test_16bit_route_any_lengths_and_aliased_qk(poisoned):
    """16-bit q / k are quantized apart (bitwise ``reference.quantize_per_token``): q with
    another length than k, and q and k one tensor (self-attention on one projection)."""
    q, k, v = inputs(1, 77, 150, 2, 64)
    out = ditfuse.attention(q, k, v, precision="fp8")
    q8, k8, qs, ks = quantized(q, k)
    assert torch.equal(out, ditfuse.attention(q8, k8, v, precision="fp8", q_scale=qs, k_scale=ks))
    assert metrics(out, reference64(q, k, v))[0] >= COS_MIN
    x = k.transpose(1, 2).contiguous()  # (B, H, S, D)
    vt = v.transpose(1, 2).contiguous()
    out = ditfuse.attention(x, x, vt, precision="fp8", layout="bhsd")
    x8, xs = quantize_per_token(x, "int8", layout="bhsd")
    assert torch.equal(
        out, ditfuse.attention(x8, x8, vt, precision="fp8", q_scale=xs, k_scale=xs, layout="bhsd")
    )
    assert metrics(out.transpose(1, 2), reference64(k, k, v))[0] >= COS_MIN


@pytest.mark.parametrize("dtype,layout", [(torch.bfloat16, "bshd"), (torch.float16, "bhsd")])
def test_quantize_per_token_matches_reference(dtype, layout):
    """The op's per-token int8 quantizer, bitwise the reference: strided input (a slice of a
    packed projection), a zero token (scale 1), ties of the rounding, a token holding a NaN
    (NaN scale, values 0) and one holding an infinity (infinite scale)."""
    B, S, H, D = 2, 70, 3, 128
    qkv = torch.randn(B, S, 3, H, D, device=DEVICE).to(dtype) * 4
    x = qkv[:, :, 1]
    if layout == "bhsd":
        x = x.transpose(1, 2)
    x4 = x if layout == "bshd" else x.transpose(1, 2)
    x4[0, 3, 1] = 0
    x4[1, 5, 2] = torch.arange(D, device=DEVICE).to(dtype) - 63.5  # amax 127: x * inv ties
    x4[1, 9, 0, 17] = float("nan")
    x4[0, 11, 2, 3] = float("inf")
    y, s = A.quantize_per_token(x, layout)
    ry, rs = quantize_per_token(x, "int8", layout=layout)
    assert y.shape == x.shape and y.dtype == torch.int8 and s.shape == (B, H, S)
    assert torch.equal(y, ry)
    assert torch.equal(s.nan_to_num(-1.0), rs.nan_to_num(-1.0))
    assert s[0, 1, 3] == 1.0 and s[1, 0, 9].isnan() and s[0, 2, 11].isinf()
    assert (s.isnan().sum(), s.isinf().sum()) == (1, 1)
    assert not y.transpose(1, 2)[1, 9, 0].any() if layout == "bhsd" else not y[1, 9, 0].any()


def test_row_sum_of_the_rounded_p(poisoned):
    """The row sum is the sum of the rounded P that multiplies V: one key 2.5 nats above
    4,095 equal ones (its P rounds to 256, theirs, 256 e^-2.5 = 21.01, to 22) with V all one
    value gives exactly that value -- 1.0, and fp16 64,000 (not inf) --, kernel and
    emulation; with random V every output lies within its channel's quantized values."""
    S, D = 4096, 64
    q8 = torch.zeros(1, 8, 1, D, dtype=torch.int8, device=DEVICE)
    q8[..., 0] = 1
    k8 = torch.zeros(1, S, 1, D, dtype=torch.int8, device=DEVICE)
    big = int(torch.randint(0, S, ()))
    k8[0, big, 0, 0] = 1
    qs = torch.ones(1, 1, 8, device=DEVICE)
    ks = torch.full((1, 1, S), 2.5, device=DEVICE)
    for value, dtype in ((1.0, torch.bfloat16), (64000.0, torch.float16)):
        v = torch.full((1, S, 1, D), value, dtype=dtype, device=DEVICE)
        out = ditfuse.attention(q8, k8, v, precision="fp8", q_scale=qs, k_scale=ks, scale=1.0)
        emu = attention_8bit_core(q8, k8, v, qs, ks, scale=1.0)
        assert (out == value).all() and (emu == value).all(), (value, out.max(), emu.max())
    # random inputs: a convex combination of the quantized rows of V
    q, k, v = inputs(1, 100, 1000, 2, 64)
    v = v + 3  # one-signed channels: an unnormalised P would leave their range
    q8, k8, qs, ks = quantized(q, k)
    out = ditfuse.attention(q8, k8, v, precision="fp8", q_scale=qs, k_scale=ks)
    v8, vs = quantize_v_e4m3(v)
    vq = (v8.float() * vs[:, None]).to(v.dtype)
    lo, hi = vq.amin(1, keepdim=True), vq.amax(1, keepdim=True)
    assert ((out >= lo) & (out <= hi)).all()


def test_nan_propagates_as_in_softmax_attention(poisoned):
    """A NaN in q / k / v gives NaN where softmax attention (SDPA, the 16-bit band kernel)
    does, and finite values elsewhere: q[i] -> row i; k[j] -> every row that attends key j;
    v[j, d] -> channel d of every row (through V's channel scale); the 16-bit route and the
    emulation alike."""
    B, S, H, D = 1, 160, 2, 64
    q, k, v = inputs(B, S, S, H, D)
    q[0, 5, 0, 9] = float("nan")
    k[0, 77, 1, 3] = float("nan")
    v[0, 40, 0, 17] = float("nan")
    out = ditfuse.attention(q, k, v, precision="fp8")
    ref = ditfuse.attention(q, k, v)
    assert ref.isnan().any() and torch.equal(out.isnan(), ref.isnan())
    q8, k8, qs, ks = quantized(q, k)
    emu = attention_8bit_core(q8, k8, v, qs, ks, scale=1 / math.sqrt(D))
    assert torch.equal(emu.isnan(), ref.isnan())
    # in a band, a NaN key only reaches the rows whose band holds it
    v = v.nan_to_num(0.5)
    for window in ((10, 20), (-1, 0)):
        out = ditfuse.attention(q, k, v, precision="fp8", window=window)
        ref = ditfuse.attention(q, k, v, window=window)
        assert ref.isnan().any() and torch.equal(out.isnan(), ref.isnan()), window
    # a key mask keeps a key whose scale is NaN
    mask = torch.ones(B, S, dtype=torch.bool, device=DEVICE)
    mask[0, 100:] = False
    out = ditfuse.attention(q, k, v, precision="fp8", key_mask=mask)
    ref = ditfuse.attention(q, k, v, key_mask=mask)
    assert torch.equal(out.isnan(), ref.isnan()) and out[:, :, 1].isnan().all()


def test_quantize_v_nan_channel():
    """A NaN in V makes its channel's scale NaN (kernel and reference); the other channels'
    scales and values stay bitwise the reference's."""
    v = torch.randn(2, 90, 3, 64, dtype=torch.bfloat16, device=DEVICE)
    v[1, 70, 2, 8] = float("nan")
    vt, vs = A.quantize_v(v)
    v8, rs = quantize_v_e4m3(v)
    assert vs[1, 2, 8].isnan() and rs[1, 2, 8].isnan() and vs.isnan().sum() == 1
    assert torch.equal(vs.nan_to_num(-1.0), rs.nan_to_num(-1.0))
    ok = ~vs.isnan()
    a = vt[..., :90].view(torch.uint8).permute(0, 3, 1, 2)
    assert torch.equal(a[:, :, ok[0] & ok[1]], v8.view(torch.uint8)[:, :, ok[0] & ok[1]])


def test_large_key_scales(poisoned):
    """Key scales near fp32's top with query scales near its bottom (|k| ~ 1e33, |q| ~
    1e-33: scores of order one): the integer score times the key scale, no overflow of
    (1.5 * 2^23 + s) * k_scale."""
    q, k, v = inputs(1, 130, 130, 2, 64)
    q8, k8, qs, ks = quantized(q, k)
    qs, ks = qs * 1e-33, ks * 1e33
    out = ditfuse.attention(q8, k8, v, precision="fp8", q_scale=qs, k_scale=ks)
    emu = attention_8bit_core(q8, k8, v, qs, ks, scale=1 / 8)
    assert torch.isfinite(out).all() and torch.isfinite(emu).all()
    assert metrics(out, emu)[1] <= KERNEL_VS_EMULATION
    assert metrics(out, reference64(q, k, v))[0] >= COS_MIN


def test_scales_requiring_grad_and_fp32_q():
    q, k, v = inputs(1, 64, 64, 2, 64)
    q8, k8, qs, ks = quantized(q, k)
    for name in ("q_scale", "k_scale"):
        kw = dict(q_scale=qs, k_scale=ks)
        kw[name] = kw[name].clone().requires_grad_()
        with pytest.raises(RuntimeError, match="inference-only"):
            ditfuse.attention(q8, k8, v, precision="fp8", **kw)
    with pytest.raises(
        TypeError,
        match=r"q.dtype must be float16 / bfloat16 .*int8 / "
        r"float8_e4m3fn with q_scale.*float32",
    ):
        ditfuse.attention(q.float(), k.float(), v, precision="fp8")


# ---------------------------------------------------------------------------------------
# sm_90 builds on the CPU and the kernel on the GPU


@pytest.mark.slow
def test_sm90_builds():
    """Every production specialization compiles for sm_90a with no spill, integer and e4m3
    wgmma in the key loop, no I2F there, shared memory within 227 KB."""
    from ditfuse.tools.inspect_attention_fp8 import build_report

    rows = build_report()
    assert len(rows) >= 8
    for r in rows:
        assert not r["violations"], (r["name"], r["violations"])
        if r["kernel"] == "_attention_8bit_kernel":
            assert r["loop_ex2"] > 0


def test_early_unpack_scan():
    """The build check that caught the stale row sum: an e4m3 unpack ahead of a loop's first
    wgmma counts (the miscompiled build's loop head), one after it does not."""
    from ditfuse.tools.inspect_attention_fp8 import early_unpacks

    def sass(body):
        lines = [
            f"        /*{0x100 + 16 * i:04x}*/                   {s} ;" for i, s in enumerate(body)
        ]
        lines.append(f"        /*{0x100 + 16 * len(body):04x}*/                   @!P1 BRA 0x100 ;")
        return "\n".join(lines)

    unpack, gmma = "F2FP.F16.E4M3.UNPACK_B R155, R155", "IGMMA.64x128x32.S8.S8 R24, gdesc[UR4], R24"
    assert early_unpacks(sass([unpack, "FADD R1, R1, R2", gmma])) == 1
    assert early_unpacks(sass(["FADD R1, R1, R2", gmma, unpack])) == 0


@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU (H100 / H200)")
@pytest.mark.parametrize("kind", ["randn", "rmsnorm"])
@pytest.mark.parametrize(
    "shape", [(1, 4096, 4096, 8, 128), (2, 1000, 1777, 4, 64), (1, 4608, 4608, 4, 128)]
)
def test_gpu_kernel(shape, kind, poisoned):
    """16-bit q / k / v on the GPU (the warp-specialized kernel): float64's answer within the
    8-bit tolerances, and the emulation of the operands that route quantizes (K a 128-key
    tile after the mean key; per-token K scales would be another scheme)."""
    from ditfuse.tools.check_attention_fp8 import _operands

    B, Sq, Skv, H, D = shape
    q, k, v = inputs(B, Sq, Skv, H, D, kind, device="cuda")
    out = ditfuse.attention(q, k, v, precision="fp8")
    cos, rel = metrics(out, reference64(q, k, v))
    assert cos >= COS_MIN and rel <= REL_L2_MAX, (cos, rel)
    q8, k8, qs, ks = _operands(q, k)
    emu = attention_8bit_core(q8, k8, v, qs, ks, scale=1 / math.sqrt(D))
    assert metrics(out, emu)[1] <= KERNEL_VS_EMULATION


@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU (H100 / H200)")
@pytest.mark.parametrize("fmt", ["int8", "fp8"])
@pytest.mark.parametrize("masked", [False, True])
def test_gpu_8bit_qk(fmt, masked, poisoned):
    """8-bit q / k (and a key mask) on the GPU: the answer of softmax attention within the
    8-bit tolerances (the Triton kernel)."""
    # e4m3 q / k (three fraction bits) are held to their tolerance on random normal inputs:
    # after an RMSNorm with outlier channel weights they reach cosine ~0.9975, as the
    # emulation does (benchmarks/logs/2026-12-06-attention-8bit-rowsum-forms-h100.log)
    kind = "rmsnorm" if fmt == "int8" else "randn"
    q, k, v = inputs(1, 1000, 1000, 4, 128, kind, device="cuda")
    km = torch.rand(1, 1000, device="cuda") > 0.3 if masked else None
    q8, k8, qs, ks = quantized(q, k, fmt)
    out = ditfuse.attention(q8, k8, v, precision="fp8", q_scale=qs, k_scale=ks, key_mask=km)
    p = A.plan(q8, k8, v, q_scale=qs, k_scale=ks, key_mask=km)
    emu = attention_8bit_core(p.q, p.k, p.v, p.q_scale, p.k_scale, scale=p.scale, key_mask=km)
    assert metrics(out, emu)[1] <= KERNEL_VS_EMULATION
    cos, rel = metrics(out, reference64(q, k, v, key_mask=km))
    if fmt == "int8":
        assert cos >= COS_MIN and rel <= REL_L2_MAX, (cos, rel)
    else:
        assert cos >= ATTENTION_8BIT_E4M3_QK_COS_MIN, (cos, rel)
        assert rel <= ATTENTION_8BIT_E4M3_QK_REL_L2_MAX, (cos, rel)


@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU (H100 / H200)")
@pytest.mark.parametrize("masked", [False, True])
def test_gpu_triton_8bit_kernel(masked, poisoned):
    """The Triton kernel's sm_90 build itself (the build whose row sum read stale e4m3 P
    registers gave cosine ~0.6): the float64 answer and the emulation of the same scheme."""
    assert A.triton_kernel_runs(torch.device("cuda"))
    q, k, v = inputs(1, 1000, 1000, 2, 128, "rmsnorm", device="cuda")
    km = torch.rand(1, 1000, device="cuda") > 0.3 if masked else None
    q8, k8, qs, ks = quantized(q, k)
    p = A.plan(q8, k8, v, q_scale=qs, k_scale=ks, key_mask=km)
    out = A.launch(p)
    cos, rel = metrics(out, reference64(q, k, v, key_mask=km))
    assert cos >= COS_MIN and rel <= REL_L2_MAX, (cos, rel)
    emu = attention_8bit_core(p.q, p.k, p.v, p.q_scale, p.k_scale, scale=p.scale, key_mask=km)
    assert metrics(out, emu)[1] <= KERNEL_VS_EMULATION


@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU (H100 / H200)")
def test_gpu_equal_v_is_v():
    """Equal rows of V come out as V: the row sum adds the same rounded P that multiplies V
    (a sum of the unrounded P was off by up to 1.6 % here)."""
    q, k, _ = inputs(1, 2048, 2048, 2, 128, device="cuda")
    row = (torch.rand(1, 1, 2, 128, device="cuda") * 4 - 2).to(torch.bfloat16)
    v = row.expand(1, 2048, 2, 128).contiguous()
    q8, k8, qs, ks = quantized(q, k)
    out = A.launch(A.plan(q8, k8, v, q_scale=qs, k_scale=ks))
    assert torch.equal(out, v), (out.float() - v.float()).abs().max()


@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU (H100 / H200)")
def test_gpu_band():
    q, k, v = inputs(1, 3000, 3000, 4, 128, device="cuda")
    out = ditfuse.attention(q, k, v, precision="fp8", window=(300, 200))
    cos, rel = metrics(out, reference64(q, k, v, (300, 200)))
    assert cos >= COS_MIN and rel <= REL_L2_MAX, (cos, rel)


@pytest.mark.slow
def test_check_gates_small():
    """``ditfuse check``'s 8-bit attention and quantizing-prologue gates pass (few tokens)."""
    from ditfuse.tools import check_attention_fp8
    from ditfuse.tools.check import Gates

    g = Gates(echo=False)
    check_attention_fp8.check_gates(g, DEVICE, True)
    check_attention_fp8.check_8bit_qk_gates(g, DEVICE, True)
    check_attention_fp8.check_out_rows8_gates(g, DEVICE, True)
    assert len(g.rows) == check_attention_fp8.planned(True) and g.ok, g.table()


def test_out_rows8_gates_fail_on_a_wrong_scale(monkeypatch):
    """The e4m3-output gates fail where the rows are not the 16-bit output's quantization (a
    stand-in whose scale is a token's own amax, the scheme the contract does not promise)."""
    from ditfuse.ops.linear_fp8 import quantize_rows
    from ditfuse.tools import check_attention_fp8
    from ditfuse.tools.check import Gates

    def per_token(o, v, key_mask=None):
        q8, s = quantize_rows(o.flatten(2))
        return q8.view(o.shape), s.view(o.shape[:2])

    monkeypatch.setattr(A, "out_rows8", per_token)
    monkeypatch.setattr(API, "_ws_ok", lambda *a, **k: False)
    g = Gates(echo=False)
    check_attention_fp8.check_out_rows8_gates(g, DEVICE, True)
    assert len(g.rows) == len(check_attention_fp8.OUT_ROWS8)
    assert all(r[2] == "FAIL" for r in g.rows), g.table()


def test_8bit_qk_gates_fail_on_a_wrong_answer(monkeypatch):
    """The 8-bit-input gates fail where the 8-bit path answers wrong (a stand-in that drops
    the softmax's normalisation, as the Triton kernel's wrong sm_90 build did not divide
    right): each row of the three."""
    from ditfuse.tools import check_attention_fp8
    from ditfuse.tools.check import Gates

    real = A.run
    monkeypatch.setattr(A, "run", lambda p: real(p) * 100.0)
    g = Gates(echo=False)
    check_attention_fp8.check_8bit_qk_gates(g, DEVICE, True)
    assert len(g.rows) == len(check_attention_fp8.QK_8BIT)
    assert all(r[2] == "FAIL" for r in g.rows), g.table()
