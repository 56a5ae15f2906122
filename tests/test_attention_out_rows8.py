"""``ditfuse.attention(..., quantize_out="fp8")``: the attention's output as the e4m3 rows of
an FP8 output projection, one scale a batch entry from V's largest attended value. The
contract (:func:`ditfuse.reference.attention_out_rows8` of the same route's 16-bit output,
bitwise), its edge cases, the errors, and Wan's patched processor handing the rows to its
FP8 output projection. The warp-specialized kernel's epilogue is checked on an sm_90 GPU in
tests/test_attention_fp8_ws.py."""

import pytest
import torch

import ditfuse
from ditfuse.ops.linear_fp8 import Rows8
from ditfuse.reference import attention_out_rows8

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the CPU routes (the GPU's: test_attention_fp8_ws.py)"
)


def _qkv(B, Sq, Skv, H, D, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, S, H, D, generator=g).to(dtype) for S in (Sq, Skv, Skv))
    return q, k, v


@pytest.mark.parametrize(
    "B,Sq,Skv,H,D,dtype,masked",
    [
        (2, 37, 200, 3, 64, torch.bfloat16, False),
        (1, 130, 129, 2, 128, torch.float16, False),
        (3, 17, 77, 1, 64, torch.bfloat16, True),
    ],
)
def test_quantize_out_is_the_16bit_output_quantized(B, Sq, Skv, H, D, dtype, masked):
    """Bitwise the reference applied to the 16-bit output of the same call, every element;
    the batch entries' bounds differ; the rows dequantize to the 16-bit output within
    e4m3's rounding."""
    q, k, v = _qkv(B, Sq, Skv, H, D, dtype, seed=Sq)
    v[-1] *= 9.0
    key_mask = None
    if masked:
        key_mask = torch.rand(B, Skv, generator=torch.Generator().manual_seed(1)) < 0.5
        key_mask[0] = False  # an entry without a key: zeros, scale 1
    with torch.no_grad():
        o16 = ditfuse.attention(q, k, v, precision="fp8", key_mask=key_mask)
        r = ditfuse.attention(q, k, v, precision="fp8", key_mask=key_mask, quantize_out="fp8")
    assert isinstance(r, Rows8) and r.dtype == dtype
    assert r.q.shape == (B, Sq, H * D) and r.q.is_contiguous() and r.scale.shape == (B, Sq)
    want_q, want_s = attention_out_rows8(o16, v, key_mask)
    assert torch.equal(r.q.view(torch.uint8), want_q.flatten(2).view(torch.uint8))
    assert torch.equal(r.scale, want_s)
    for b in range(B):
        kept = slice(None) if key_mask is None else key_mask[b]
        amax = v[b][kept].abs().amax().float() if v[b][kept].numel() else torch.tensor(0.0)
        want = amax / 448 if amax > 0 else torch.tensor(1.0)
        assert (r.scale[b] == want).all(), (b, r.scale[b, 0], want)
    deq = r.q.float() * r.scale[..., None]
    x = o16.flatten(2).float()
    # e4m3's normal range: 2^-4 relative; below 2^-6 of the scale, subnormal steps of 2^-9
    tol = torch.maximum(x.abs() * 2.0**-4, r.scale[..., None] * 2.0**-10)
    assert ((deq - x).abs() <= tol).all()
    if masked:
        assert (r.scale[0] == 1).all() and (r.q[0].float() == 0).all()


def test_quantize_out_from_8bit_qk():
    """From int8 q / k with their scales (the Triton kernel's route): the same contract."""
    from ditfuse.ops.attention_fp8 import quantize_per_token

    q, k, v = _qkv(2, 50, 90, 2, 64, torch.bfloat16, seed=3)
    (q8, qs), (k8, ks) = (quantize_per_token(t, "bshd") for t in (q, k))
    kw = dict(precision="fp8", q_scale=qs, k_scale=ks)
    with torch.no_grad():
        o16 = ditfuse.attention(q8, k8, v, **kw)
        r = ditfuse.attention(q8, k8, v, quantize_out="fp8", **kw)
    want_q, want_s = attention_out_rows8(o16, v)
    assert torch.equal(r.q.view(torch.uint8), want_q.flatten(2).view(torch.uint8))
    assert torch.equal(r.scale, want_s)


def test_reference_edge_cases():
    """A zero V: zeros and scale 1; a NaN or an infinity among the attended values: zeros and
    scale NaN (the projection's rows NaN), and only for that batch entry; a value left out
    by the key mask does not count; the conversion saturates a value a rounding above the
    bound instead of giving NaN."""
    o = torch.randn(3, 5, 2, 4).bfloat16()
    v = torch.randn(3, 7, 2, 4).bfloat16()
    v[0] = 0.0
    v[1, 3, 1, 2] = float("nan")
    q8, s = attention_out_rows8(o, v)
    assert (s[0] == 1).all() and torch.isnan(s[1]).all() and (s[2] > 0).all()
    assert (q8[1].float() == 0).all()
    assert torch.equal(q8[0].float(), o[0].float().to(torch.float8_e4m3fn).float())
    v[1, 3, 1, 2] = float("inf")
    assert torch.isnan(attention_out_rows8(o, v)[1][1]).all()
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, 3] = False
    _, s = attention_out_rows8(o, v, mask)
    assert torch.isfinite(s[1]).all()
    assert s[1, 0] == v[1][mask[1]].abs().amax().float() / 448
    # an output a rounding above the bound (the kernel's accumulation) saturates at 448
    v2 = torch.ones(1, 3, 1, 4).bfloat16()
    o2 = torch.full((1, 2, 1, 4), 1.0078125).bfloat16()
    q2, s2 = attention_out_rows8(o2, v2)
    assert (q2.float() == 448).all() and (s2 == 1 / 448).all()


def test_quantize_out_errors():
    q, k, v = _qkv(1, 8, 8, 1, 64, torch.bfloat16, seed=4)
    with pytest.raises(ValueError, match="quantize_out must be None or 'fp8'"):
        ditfuse.attention(q, k, v, precision="fp8", quantize_out="int8")
    with pytest.raises(ValueError, match="goes with precision='fp8'"):
        ditfuse.attention(q, k, v, quantize_out="fp8")
    with pytest.raises(ValueError, match="layout='bshd'"):
        ditfuse.attention(q, k, v, precision="fp8", layout="bhsd", quantize_out="fp8")
    with pytest.raises(ValueError, match="head_dim"):
        q48, k48, v48 = (t[..., :48] for t in (q, k, v))
        ditfuse.attention(q48, k48, v48, precision="fp8", quantize_out="fp8")


def test_opcheck_out_rows8_op():
    """The pass after the kernel, as an op (so a compiled graph keeps its IEEE divisions):
    the op and its fake agree, with and without a key mask."""
    op = torch.ops.ditfuse.attention_out_rows8.default
    _, _, v = _qkv(2, 9, 33, 3, 64, torch.bfloat16, seed=5)
    o = torch.randn(2, 9, 3, 64).bfloat16()
    torch.library.opcheck(op, (o, v, None))
    torch.library.opcheck(op, (o, v, torch.rand(2, 33) > 0.5))


@pytest.mark.slow
def test_quantize_out_under_compile():
    """Under torch.compile the rows are bitwise the eager call's."""
    q, k, v = _qkv(1, 40, 70, 2, 64, torch.bfloat16, seed=6)

    def f(q, k, v):
        r = ditfuse.attention(q, k, v, precision="fp8", quantize_out="fp8")
        return r.q, r.scale

    with torch.no_grad():
        eager = f(q, k, v)
        compiled = torch.compile(f, fullgraph=True)(q, k, v)
    assert torch.equal(eager[0].view(torch.uint8), compiled[0].view(torch.uint8))
    assert torch.equal(eager[1], compiled[1])
