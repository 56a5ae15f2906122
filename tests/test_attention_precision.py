"""fp32 band attention follows PyTorch's float32 matmul precision: ``"highest"`` (PyTorch's
default) multiplies fp32-accurately, ``"high"`` / ``"medium"`` in tf32; ``precision=``
overrides the global setting. 16-bit inputs are unaffected."""

import pytest
import torch
from conftest import DEVICE

import ditfuse
from ditfuse.ops import attention as A
from ditfuse.tolerances import ATTENTION_HIGH_REL, ATTENTION_HIGHEST_REL, ATTENTION_WINDOW0_REL

SWA = ditfuse.sliding_window_attention
#: the issue's bounds: relative to max |ref| of an fp64 evaluation of the formula
HIGHEST_REL, HIGH_REL = ATTENTION_HIGHEST_REL, ATTENTION_HIGH_REL
WINDOW0_REL = ATTENTION_WINDOW0_REL


@pytest.fixture
def matmul_precision():
    old = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(old)


def _qkv(g, B, N, H, D, dtype=torch.float32, n=3):
    return [torch.randn(B, N, H, D, generator=g).to(DEVICE, dtype) for _ in range(n)]


def _poisoned_call(fn):
    out = fn()
    assert torch.isfinite(out).all()
    return out


@torch.no_grad()
def test_window0_returns_v_at_the_default():
    """Each query sees only its own key: softmax weight exactly 1, the output is v."""
    assert torch.get_float32_matmul_precision() == "highest"
    g = torch.Generator().manual_seed(0)
    q, k, v = _qkv(g, 2, 70, 3, 64)
    out = SWA(q, k, v, 0)
    rel = ((out - v).abs() / v.abs().clamp_min(1e-30)).max().item()
    assert rel <= WINDOW0_REL, rel


@pytest.mark.parametrize("D", [32, 64, 128])
@pytest.mark.parametrize("diff", [False, True], ids=["plain", "diff"])
@torch.no_grad()
def test_highest_and_high_vs_fp64(D, diff, matmul_precision):
    g = torch.Generator().manual_seed(D + 7 * diff)
    q, k, v, q2, k2 = _qkv(g, 1, 90, 2, D, n=5)
    kw = dict(q2=q2, k2=k2, lam=0.7) if diff else {}
    ref = ditfuse.sliding_window_attention_reference(q, k, v, 17, compute_dtype=torch.float64, **kw)
    scale = ref.abs().max().item()
    for prec, bound in (("highest", HIGHEST_REL), ("high", HIGH_REL), ("medium", HIGH_REL)):
        out = SWA(q, k, v, 17, precision=prec, **kw)
        err = (out.double() - ref).abs().max().item() / scale
        assert err <= bound, (prec, err)
    # the global setting, when precision is not given
    matmul_precision("high")
    e_high = (SWA(q, k, v, 17, **kw).double() - ref).abs().max().item() / scale
    matmul_precision("highest")
    e_highest = (SWA(q, k, v, 17, **kw).double() - ref).abs().max().item() / scale
    assert e_highest <= HIGHEST_REL < e_high <= HIGH_REL, (e_highest, e_high)


@torch.no_grad()
def test_explicit_precision_overrides_the_global_setting(matmul_precision):
    g = torch.Generator().manual_seed(3)
    q, k, v = _qkv(g, 1, 40, 2, 64)
    matmul_precision("medium")
    a = SWA(q, k, v, 0, precision="highest")
    matmul_precision("highest")
    b = SWA(q, k, v, 0, precision="high")
    assert (a - v).abs().max() <= WINDOW0_REL * v.abs().max()
    assert (b - v).abs().max() > 1e-4 * v.abs().max()  # tf32 rounding of v shows


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@torch.no_grad()
def test_16bit_unaffected(dtype):
    g = torch.Generator().manual_seed(4)
    q, k, v = _qkv(g, 1, 48, 2, 64, dtype)
    outs = [SWA(q, k, v, 5, precision=p) for p in ("highest", "high", "medium")]
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_bad_precision_names_the_argument():
    q = torch.randn(1, 8, 1, 32, device=DEVICE)
    for bad in ("tf32", 1, ["highest"]):
        with pytest.raises(ValueError, match="precision must be one of"):
            SWA(q, q, q, 2, precision=bad)


def test_precision_in_the_op_arguments(matmul_precision):
    """Under torch.compile the op receives the precision resolved when the call is traced."""
    q = torch.randn(1, 8, 1, 32, device=DEVICE)
    assert A.op_args(q, q, q, 2)[-1] == "highest"
    matmul_precision("high")
    assert A.op_args(q, q, q, 2)[-1] == "high"
    assert A.op_args(q, q, q, 2, precision="highest")[-1] == "highest"
