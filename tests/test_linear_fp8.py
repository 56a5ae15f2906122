"""FP8 linear layers (``ditfuse.ops.linear_fp8``): the per-token e4m3 quantizer bitwise against
its reference (awkward widths, the two-pass form, zero / NaN / huge rows, strided rows), the
FP8 GEMM against the fp64 product of the quantized operands and against the 16-bit linear,
the torch.library op under torch.compile, bad inputs rejected by name before any launch."""

import pytest
import torch

from ditfuse.ops.linear_fp8 import QuantRowsConfig, linear_fp8, quantize_rows, quantize_weight
from ditfuse.reference import linear_fp8_reference, quantize_rows_fp8_reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# One FP8 GEMM on random inputs against the 16-bit linear: e4m3 keeps 3 mantissa bits on
# both operands (measured 0.026-0.04 relative L2).
COS_MIN = 0.999
REL_L2_MAX = 0.05


def _bits(q):
    return q.view(torch.uint8)


def _same(a, b):
    return torch.equal(a.nan_to_num(-1.0), b.nan_to_num(-1.0))


@pytest.mark.parametrize("K", [16, 64, 80, 3072, 5120, 13824, 16385, 20000])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_quantize_rows_bitwise(K, dtype):
    M = 7 if K > 10000 else 37
    x = (torch.randn(M, K, dtype=torch.float32) * torch.rand(M, 1) * 5).to(dtype).to(DEV)
    x[1] = 0.0  # all-zero row: zeros, scale 1
    x[2, K // 2] = float("nan")  # NaN row: scale NaN, zeros
    x[3, -1] = 6e4 if dtype == torch.float16 else 1e30  # one huge element dominates the amax
    x[4] = x[4] * 1e-30 if dtype != torch.float16 else x[4]  # tiny row (fp32 / bf16 range)
    x[5, K // 3] = float("-inf")  # an infinite row: as a NaN row
    q, s = quantize_rows(x)
    rq, rs = quantize_rows_fp8_reference(x)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert q.shape == (M, K) and s.shape == (M,)
    assert torch.equal(_bits(q), _bits(rq))
    assert _same(s, rs)
    assert s[1].item() == 1.0 and torch.isnan(s[2]) and not q[2].float().any()
    assert torch.isnan(s[5]) and not q[5].float().any()
    # dequantized rows are x within e4m3's relative rounding (2^-4) where finite
    ok = torch.isfinite(s)
    deq = q.float()[ok] * s[ok, None]
    ref = x.float()[ok]
    assert ((deq - ref).abs() <= ref.abs() * 2.0**-4 + s[ok, None] * 2.0**-9).all()


@pytest.mark.parametrize("K", [16, 80, 1000, 3072, 5120, 13824, 20000])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_quantize_rows_gelu_bitwise(K, dtype):
    """The GELU in the quantizing pass (the FFN-out input): bitwise the reference quantizer of
    the reference GELU rounded to x's dtype, at widths held as one tile, as two or three
    pieces (13,824 = 8,192 + 4,096 + 2,048 with 512 masked columns) and in chunks."""
    M = 5 if K > 10000 else 21
    g = torch.Generator().manual_seed(K)
    x = (torch.randn(M, K, generator=g) * torch.rand(M, 1, generator=g) * 4).to(dtype).to(DEV)
    x[1] = 0.0
    x[2, K // 2] = float("nan")
    x[3, K - 1] = 200.0  # the amax in the last piece's last column
    q, s = quantize_rows(x, activation="gelu_tanh")
    rq, rs = quantize_rows_fp8_reference(x, "gelu_tanh")
    assert torch.equal(_bits(q), _bits(rq)) and _same(s, rs)
    assert s[3].item() == pytest.approx(200.0 / 448.0) and torch.isnan(s[2])


def test_quantize_rows_strided_and_batched():
    base = torch.randn(3, 40, 2 * 256, dtype=torch.bfloat16, device=DEV)
    x = base[..., 256:]  # row stride 512, unit column stride
    q, s = quantize_rows(x)
    rq, rs = quantize_rows_fp8_reference(x.reshape(-1, 256))
    assert q.shape == (120, 256)
    assert torch.equal(_bits(q), _bits(rq)) and _same(s, rs)


def test_quantize_rows_empty():
    q, s = quantize_rows(torch.randn(0, 64, dtype=torch.bfloat16, device=DEV))
    assert q.shape == (0, 64) and s.shape == (0,)


def test_config_table():
    # without the GELU the pass is bound by its bytes: one power-of-two tile
    assert QuantRowsConfig.for_width(5120) == QuantRowsConfig(
        rows=1, pieces=(8192, 0, 0), chunks=1, num_warps=8
    )
    # Wan's FFN-out row through the GELU: three pieces, 512 masked columns instead of 2,560
    assert QuantRowsConfig.for_width(13824, gelu=True).pieces == (8192, 4096, 2048)
    assert QuantRowsConfig.for_width(5120, gelu=True).pieces == (4096, 1024, 0)
    assert QuantRowsConfig.for_width(64).rows == 16
    for K in range(1, 16385, 37):  # one chunk: the pieces cover the row, powers of two
        c = QuantRowsConfig.for_width(K, gelu=True)
        p = [w for w in c.pieces if w]
        assert c.chunks == 1 and sum(p) >= K and all(w & (w - 1) == 0 for w in p), (K, c)
        assert sum(p) - K < max(p[-1], QuantRowsConfig.UNIT), (K, c)  # masked: under a piece
    big = QuantRowsConfig.for_width(20000)
    assert big.chunks * big.pieces[0] >= 20000 and big.chunks > 1


@pytest.mark.parametrize("shape", [(2, 50, 256), (1, 16), (300, 128)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_fp8_close(shape, bias):
    K, N = shape[-1], 512
    x = torch.randn(*shape, dtype=torch.bfloat16, device=DEV)
    w = (torch.randn(N, K) / K**0.5).to(torch.bfloat16).to(DEV)
    b = torch.randn(N, dtype=torch.bfloat16, device=DEV) if bias else None
    wq, ws = quantize_weight(w)
    y = torch.full((*shape[:-1], N), float("nan"), dtype=torch.bfloat16, device=DEV)
    y.copy_(linear_fp8(x, wq, ws, b))
    assert y.shape == (*shape[:-1], N) and y.dtype == torch.bfloat16
    # against the fp64 product of the quantized operands: fp32 accumulation + bf16 output
    r = linear_fp8_reference(x, w, b)
    assert ((y.double() - r).abs() <= r.abs() * 2.0**-7 + 1e-2).all()
    # against the 16-bit linear: the scheme's error
    e = x.double() @ w.double().t() + (b.double() if bias else 0)
    cos = torch.nn.functional.cosine_similarity(y.double().flatten(), e.flatten(), dim=0)
    assert cos >= COS_MIN
    assert (y.double() - e).norm() / e.norm() <= REL_L2_MAX


def test_linear_fp8_nan_row():
    x = torch.randn(4, 64, dtype=torch.bfloat16, device=DEV)
    x[2, 5] = float("nan")
    wq, ws = quantize_weight(torch.randn(32, 64, dtype=torch.bfloat16, device=DEV))
    y = linear_fp8(x, wq, ws)
    assert torch.isnan(y[2]).all() and torch.isfinite(y[[0, 1, 3]]).all()


def test_compiled_op():
    x = torch.randn(3, 20, 128, dtype=torch.bfloat16, device=DEV)
    w = torch.randn(64, 128, dtype=torch.bfloat16, device=DEV) / 11
    wq, ws = quantize_weight(w)
    eager = linear_fp8(x, wq, ws)
    f = torch.compile(lambda t: linear_fp8(t, wq, ws), fullgraph=True, backend="aot_eager")
    assert torch.equal(f(x), eager)


def test_bad_inputs():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    wq, ws = quantize_weight(torch.randn(32, 64, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="x must be float16, bfloat16 or float32"):
        quantize_rows(x.to(torch.int32))
    with pytest.raises(ValueError, match="unit stride"):
        quantize_rows(torch.randn(64, 4).t())
    with pytest.raises(ValueError, match="w must be a 2-D weight"):
        quantize_weight(torch.randn(4, 4, 4))
    with pytest.raises(TypeError, match="w_q must be a 2-D float8_e4m3fn"):
        linear_fp8(x, torch.randn(32, 64, dtype=torch.bfloat16), ws)
    with pytest.raises(ValueError, match="must equal w_q's in_features"):
        linear_fp8(torch.randn(4, 48, dtype=torch.bfloat16), wq, ws)
    with pytest.raises(TypeError, match="x must be float16 or bfloat16"):
        linear_fp8(x.float(), wq, ws)
    with pytest.raises(ValueError, match="w_scale must be float32"):
        linear_fp8(x, wq, ws[:5])
    with pytest.raises(ValueError, match="bias must be"):
        linear_fp8(x, wq, ws, torch.randn(31, dtype=torch.bfloat16))
    w40, s40 = quantize_weight(torch.randn(40, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="multiples of 16"):
        linear_fp8(x, w40, s40)


_GATES = {
    "none": lambda B, S, N: None,
    "batch fp32": lambda B, S, N: torch.rand(B, 1, N) * 2 - 0.5,  # Wan's modulation chunk
    "shared fp32": lambda B, S, N: torch.rand(N),
    "batch 2-D bf16": lambda B, S, N: (torch.rand(B, N) - 0.5).to(torch.bfloat16),  # FLUX
    "token fp32": lambda B, S, N: torch.rand(B, S, N),  # Wan 2.2 TI2V
}


@pytest.mark.parametrize("gate", sorted(_GATES))
@pytest.mark.parametrize("B,S", [(2, 150), (3, 5), (1, 1)])
def test_linear_fp8_residual(B, S, gate):
    """``linear_fp8(..., residual=, gate=)`` is bit for bit ``ditfuse.gated_residual`` of the
    linear's output, whichever route takes it (the GEMM's epilogue on sm_90 where the gate is
    a row a batch entry of a tile's rows or more; the residual kernel after the GEMM
    otherwise), for the rounding the gate's chain has; the residual stream is left as it
    was. (B, N) residuals are one token a batch entry."""
    from ditfuse import gated_residual

    K, N = 96, 256
    per_op = "bf16" in gate
    x = torch.randn(B, S, K, dtype=torch.bfloat16, device=DEV)
    wq, ws = quantize_weight((torch.randn(N, K) / K**0.5).to(torch.bfloat16).to(DEV))
    b = torch.randn(N, dtype=torch.bfloat16, device=DEV)
    res = (torch.randn(B, S, N) * 3).to(torch.bfloat16).to(DEV)
    g = _GATES[gate](B, S, N)
    g = None if g is None else g.to(DEV)
    if S == 1:  # (B, N) rows
        x, res = x[:, 0], res[:, 0]
        g = g[:, 0] if g is not None and g.dim() == 3 else g
    rounding = "per_op" if per_op else "once"
    want = gated_residual(res, linear_fp8(x, wq, ws, b), g, rounding=rounding)
    res0 = res.clone()
    got = linear_fp8(x, wq, ws, b, residual=res, gate=g, rounding=rounding)
    assert got.shape == res.shape and torch.equal(got, want)
    assert torch.equal(res, res0)


def test_linear_fp8_residual_compiled():
    x = torch.randn(2, 20, 128, dtype=torch.bfloat16, device=DEV)
    wq, ws = quantize_weight(torch.randn(64, 128, dtype=torch.bfloat16, device=DEV) / 11)
    res = torch.randn(2, 20, 64, dtype=torch.bfloat16, device=DEV)
    g = torch.rand(2, 1, 64, device=DEV)
    eager = linear_fp8(x, wq, ws, residual=res, gate=g)
    f = torch.compile(
        lambda t, r: linear_fp8(t, wq, ws, residual=r, gate=g), fullgraph=True, backend="aot_eager"
    )
    assert torch.equal(f(x, res), eager)


def test_bad_residual(monkeypatch):
    """Checked by name before the quantizer or the GEMM runs."""
    from ditfuse.ops import linear_fp8 as ops

    x = torch.randn(2, 4, 64, dtype=torch.bfloat16)
    wq, ws = quantize_weight(torch.randn(32, 64, dtype=torch.bfloat16))
    res = torch.randn(2, 4, 32, dtype=torch.bfloat16)
    g = torch.rand(2, 1, 32)

    def no_launch(*a, **k):
        raise AssertionError("a kernel ran before the check")

    monkeypatch.setattr(ops, "quantize_rows", no_launch)
    monkeypatch.setattr(ops, "gemm_fp8_rows", no_launch)
    with pytest.raises(ValueError, match=r"residual must have the output's shape \(2, 4, 32\)"):
        linear_fp8(x, wq, ws, residual=res[:, :3], gate=g)
    with pytest.raises(ValueError, match=r"residual must be \(B, S, N\) or \(B, N\)"):
        linear_fp8(x[None], wq, ws, residual=res[None], gate=g)
    with pytest.raises(ValueError, match="residual must be torch.bfloat16"):
        linear_fp8(x, wq, ws, residual=res.float(), gate=g)
    with pytest.raises(ValueError, match=r"gate must be a floating-point \(1\|B, 1\|S, N\)"):
        linear_fp8(x, wq, ws, residual=res, gate=torch.rand(3, 1, 32))
    with pytest.raises(ValueError, match=r"gate must be \(N,\), \(1\|B, N\)"):
        linear_fp8(x, wq, ws, residual=res, gate=torch.rand(1, 2, 1, 32))
    with pytest.raises(ValueError, match="gate.dtype torch.float32 must equal it"):
        linear_fp8(x, wq, ws, residual=res, gate=g, rounding="per_op")
    with pytest.raises(ValueError, match="rounding must be 'once' or 'per_op'"):
        linear_fp8(x, wq, ws, residual=res, gate=g, rounding="twice")
    with pytest.raises(ValueError, match="gate is given without a residual"):
        linear_fp8(x, wq, ws, gate=g)


def test_device_without_fp8_gemm(monkeypatch):
    from ditfuse.ops import linear_fp8 as ops

    x = torch.randn(4, 64, dtype=torch.bfloat16)
    wq, ws = quantize_weight(torch.randn(32, 64, dtype=torch.bfloat16))
    monkeypatch.setattr(ops, "fp8_gemm_ok", lambda device: False)
    with pytest.raises(RuntimeError, match="needs an sm_89\\+ GPU or the CPU; cpu is a cpu device"):
        linear_fp8(x, wq, ws)
