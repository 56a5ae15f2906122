"""The element helpers every kernel shares (``ditfuse.kernels.element``): tanh, exp2 and the
reciprocal, checked against float64 over dense ranges of fp32 inputs. On the CPU the
interpreter takes the plain Triton forms; on the GPU the approximate PTX instructions
(``ex2.approx.ftz``, ``rcp.approx.ftz``), which these bounds are written for."""

import pytest
import torch
import triton
import triton.language as tl
from conftest import DEVICE

from ditfuse.kernels.element import _ex2, _rcp, _tanh

BLOCK = 1024


@triton.jit
def _apply_kernel(x_ptr, y_ptr, n, FN: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m, other=1.0)
    if FN == 0:
        y = _tanh(x)
    elif FN == 1:
        y = _ex2(x)
    else:
        y = _rcp(x)
    tl.store(y_ptr + offs, y, mask=m)


def _apply(fn: int, x: torch.Tensor) -> torch.Tensor:
    y = torch.full_like(x, float("nan"))
    _apply_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, x.numel(), FN=fn, BLOCK=BLOCK)
    return y


def _inputs(lo: float, hi: float, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, generator=g, dtype=torch.float64) * (hi - lo) + lo
    return x.float().to(DEVICE)


@pytest.mark.parametrize("lo,hi", [(-0.3, 0.3), (-12.0, 12.0), (0.2, 0.3), (-60.0, -8.0)])
def test_tanh_within_a_few_ulp(lo, hi):
    """|tanh(x) - tanh_64(x)| <= 8 ulp of tanh_64(x) (ex2.approx's 2 ulp, carried through
    (1 - e) / (1 + e), and rcp.approx's 1); odd symmetry exact; saturates to +-1."""
    n = 20_000
    x = _inputs(lo, hi, n, seed=int(100 * (hi - lo)))
    x = torch.cat([x, -x, torch.tensor([0.0, 0.25, -0.25, 1e-30, 100.0], device=x.device)])
    y = _apply(0, x).double()
    ref = torch.tanh(x.double())
    ulp = torch.finfo(torch.float32).eps * ref.abs().clamp_min(torch.finfo(torch.float32).tiny)
    err = ((y - ref).abs() / ulp).max().item()
    assert err <= 8.0, f"max error {err:.2f} ulp"
    assert torch.equal(y[:n], -y[n : 2 * n])
    assert y[-1].item() == 1.0


def test_ex2_and_rcp():
    """2^x within 2 ulp (flushes below 2^-126, as the kernels rely on); 1/x within 1 ulp on
    [1, 2], the range tanh uses it on."""
    x = _inputs(-120.0, 120.0, 20_000, seed=1)
    y = _apply(1, x).double()
    ref = torch.exp2(x.double())
    assert (((y - ref).abs() / ref) <= 2 * torch.finfo(torch.float32).eps).all()
    x = _inputs(1.0, 2.0, 20_000, seed=2)
    y = _apply(2, x).double()
    ref = 1.0 / x.double()
    assert (((y - ref).abs() / ref) <= torch.finfo(torch.float32).eps).all()
