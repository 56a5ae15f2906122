"""The numerical contract of ``group_norm_silu`` / ``rms_norm_silu_channels`` (one place:
:func:`ditfuse.tools.check_group_norm.check_gates` and the tests use it): per-element
tolerances for chains that round to the activation dtype between steps (the rounding flips
that the SiLU carries to the output), the share of elements allowed to differ from an exact
reference, and eager torch's own extra roundings of the GroupNorm statistics. The
derivation: docs/design/group_norm.md."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ditfuse.tolerances import ONE_ROUNDING

#: one rounding of each activation dtype, as (rtol, atol): R(v) = rtol |v| + atol
#: (``ditfuse.tolerances.ONE_ROUNDING``, which says why each has its size)
ROUNDING = ONE_ROUNDING

#: silu'(y) = sigmoid(y) (1 + y (1 - sigmoid(y))) has its extrema where y tanh(y / 2) = 2:
#: 1.0998 at +_SILU_YC, -0.0998 at -_SILU_YC; |silu'| is monotone between and beyond them
_SILU_YC = 2.3993572805154676


def one_rounding(v: torch.Tensor, dtype) -> torch.Tensor:
    """``rtol |v| + atol`` of ``dtype`` (``ROUNDING``), elementwise, in v's dtype (fp64)."""
    rtol, atol = ROUNDING[dtype]
    return rtol * v.abs() + atol


def _silu_slope(y):
    s = torch.sigmoid(y)
    return s * (1 + y * (1 - s))


def silu_slope_max(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """max |silu'| over [lo, hi], elementwise: at an end, or at an extremum inside."""
    m = torch.maximum(_silu_slope(lo).abs(), _silu_slope(hi).abs())
    for yc in (_SILU_YC, -_SILU_YC):
        peak = abs(_silu_slope(torch.tensor(yc, dtype=torch.float64)).item())
        m = torch.where((lo <= yc) & (yc <= hi), m.clamp_min(peak), m)
    return m


def contract_tolerance(chain, against: torch.Tensor, extra_steps=()) -> torch.Tensor:
    """Per-element tolerance (fp64) of a result of ``chain``'s computation against ``against``.

    ``chain``: the fp64 reference of the computation, with its intermediate roundings
    (``reference.RoundedChain``); ``against``: what the result is compared with (the
    reference's output, or another implementation's that rounds at the same points);
    ``extra_steps``: ``(t, gain)`` of roundings only ``against``'s implementation makes.

    ``tol = (1 + rtol) * (R(against) + s * sum_i gain_i * R(t_i))``, ``R`` = :func:`one_rounding`:

    * ``R(against)``: the output's rounding (result and ``against`` each round once).
    * ``gain_i * R(t_i)``: an intermediate rounding ``t_i`` may land on the neighbouring value
      of the dtype (fp32 values within a few ulps of the exact one, on the other side of a
      rounding midpoint): that moves ``t_i`` by one spacing <= ``R(t_i)``, and the later steps
      carry it to the last value ``v`` (the SiLU's input, or the value the output rounds)
      times ``gain_i`` (>= ``|dv / dt_i|``); the rounding after that can add its own spacing,
      which is its own term.
    * ``s``: max ``|silu'|`` over ``[v - d, v + d]``, ``d`` the sum (mean value theorem), around
      the reference's SiLU input; 1 without SiLU. For negative ``v`` the output moves by
      ``|silu'(v)| R(v)``, up to two output roundings (at v = -4): more than "one rounding of
      the output", which holds only for a chain without intermediate rounding.
    * ``1 + rtol``: second-order terms (a rounding of a value already off by the bound,
      <= rtol / 2 of it) and the SiLU's fp32 arithmetic (~2^-22 relative).
    """
    dtype = chain.out.dtype
    rtol = ROUNDING[dtype][0]
    tol = one_rounding(against.double(), dtype)
    steps = list(chain.steps) + list(extra_steps)
    if steps:
        d = sum(g * one_rounding(t.double(), dtype) for t, g in steps)
        if chain.silu_in is not None:
            v = chain.silu_in.double()
            d = silu_slope_max(v - d, v + d) * d
        tol = tol + d
    return tol * (1 + rtol)


def differ_limit(dtype, roundings: int, sides: int = 1) -> float | None:
    """The largest share of elements of a correct result that may differ from an exact
    reference rounding at the same ``roundings`` points (None for fp32: no gate).

    A correct kernel differs only where its fp32 value of a rounded quantity and the exact
    one straddle a rounding midpoint of the dtype. They are within fp32's arithmetic
    (``ROUNDING[float32]``: rtol32 |t|) of each other, and midpoints are at least
    rtol |t| / 2 apart (the spacing at the top of a binade), so a share of at most
    2 rtol32 / rtol of the values straddles one, per rounding (bf16 5.1e-4, fp16 4.1e-3)
    and per side computing in fp32 (``sides``=2 for two fp32 implementations): GroupNorm +
    SiLU in bf16 (2 roundings) 0.10%, Wan's chain (4) 0.20%. The kernels differ from the
    fp64 reference at 0.0004-0.006% of the elements at the VAE shapes (measured); a skipped
    intermediate rounding changes ~25-35% of them, statistics rounded to bf16 (torch 2.11's
    CUDA GroupNorm) 16-31%, an unbiased variance (groups of 128) ~50%.
    """
    if dtype == torch.float32:
        return None
    return roundings * sides * 2 * ROUNDING[torch.float32][0] / ROUNDING[dtype][0]


def differ_allowed(share: float, numel: int) -> float:
    """Differing elements allowed at an expected share: ``share * numel`` plus a Poisson
    allowance (3 standard deviations + 1), so that a small tensor, where one legitimate flip
    already exceeds the share, does not fail by chance."""
    lam = share * numel
    return lam + 3 * math.sqrt(lam) + 1


def _err_over_tol(out: torch.Tensor, against: torch.Tensor, tol: torch.Tensor) -> float:
    """Largest |out - against| / tol; <= 1 passes (NaN in ``out`` gives NaN: fails)."""
    return ((out.double() - against.double()).abs() / tol).max().item()


@dataclass
class Parity:
    """One comparison under the contract: ``ok`` iff ``err`` <= 1, no NaN, and (where there
    is a limit) at most ``allowed`` elements differ."""

    err: float  # max |out - against| / contract_tolerance
    err_one: float  # the same over one output rounding alone (the naive contract)
    bitwise: float  # share of equal elements
    n_differ: int
    numel: int
    limit: float | None  # differ_limit, or None: not gated
    nan: bool

    @property
    def differ(self) -> float:
        return self.n_differ / max(self.numel, 1)

    @property
    def allowed(self) -> float | None:
        return None if self.limit is None else differ_allowed(self.limit, self.numel)

    @property
    def ok(self) -> bool:
        return (
            self.err <= 1 and not self.nan and (self.limit is None or self.n_differ <= self.allowed)
        )

    def describe(self) -> str:
        lim = "" if self.limit is None else f" (limit {100 * self.limit:.2f}%)"
        return (
            f"err/tol {self.err:.2f} (err/1 rounding {self.err_one:.2f}), "
            f"{100 * self.bitwise:.2f}% bitwise, {100 * self.differ:.4f}% differ{lim}"
        )


def parity(
    out: torch.Tensor,
    against: torch.Tensor,
    chain,
    extra_steps=(),
    sides: int = 1,
    gate_differ: bool = True,
) -> Parity:
    """``out`` against ``against`` under the contract of ``chain`` (see
    :func:`contract_tolerance`, :func:`differ_limit`; ``sides``: 1 against the fp64
    reference, 2 against another fp32 implementation rounding at the same points)."""
    assert out.shape == against.shape and out.dtype == against.dtype, (
        out.shape,
        against.shape,
        out.dtype,
        against.dtype,
    )
    tol = contract_tolerance(chain, against, extra_steps)
    err = _err_over_tol(out, against, tol)
    err_one = _err_over_tol(out, against, one_rounding(against.double(), out.dtype))
    n_diff = int((out != against).sum().item())
    limit = (
        differ_limit(out.dtype, len(chain.steps) + len(extra_steps) + 1, sides)
        if gate_differ
        else None
    )
    return Parity(
        err,
        err_one,
        1 - n_diff / max(out.numel(), 1),
        n_diff,
        out.numel(),
        limit,
        bool(torch.isnan(out).any().item()),
    )


def _eager_gn_rounds_stats(device, dtype) -> bool:
    """Whether torch's eager GroupNorm rounds each group's mean and rstd to x's dtype before
    applying them (its CUDA kernel in half precision before pytorch/pytorch#183946; the CPU
    kernel keeps them in fp32). Probe: the group [1, 1 + 3 s] (s the spacing at 1) has the
    mean 1 + 1.5 s, not a value of the dtype: fp32 statistics give exactly -1 for the first
    element, rounded ones about -4/3."""
    if dtype == torch.float32:
        return False
    s = ROUNDING[dtype][0]  # the spacing of the dtype's values in [1, 2)
    x = torch.tensor([1.0, 1.0 + 3 * s], device=device).to(dtype).reshape(1, 1, 2)
    one = torch.ones(1, device=device, dtype=dtype)
    y = torch.nn.functional.group_norm(x, 1, one, one * 0, eps=0.0)
    return abs(y[0, 0, 0].item() + 1.0) > 0.125


def eager_gn_stat_steps(chain, x: torch.Tensor, weight=None):
    """The extra roundings of an eager GroupNorm that rounds its statistics (see
    ``_eager_gn_rounds_stats``), as ``(t, gain)`` for :func:`contract_tolerance`:
    ``y = (x - mean) * rstd * w + b`` moves by ``|rstd w|`` per unit of the mean and by
    ``|(x - mean) w|`` per unit of rstd."""
    mean, rstd = chain.stats["mean"], chain.stats["rstd"]
    w = 1.0 if weight is None else weight.double().reshape(mean.shape[1:]).abs()
    return [(mean, rstd * w), (rstd, (x.double() - mean).abs() * w)]
