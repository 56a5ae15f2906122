"""GPU timers of the benchmarks."""

from __future__ import annotations

import math

import torch


def _median_us(fn, warmup=25, rep=100) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=warmup, rep=rep, return_mode="median") * 1e3


def graph_us(fn) -> float:
    """GPU time of ``fn`` (one call, warmed up) captured in a CUDA graph and replayed:
    do_bench median, L2 flushed before every replay. The sweeps' timer."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return _median_us(g.replay)


def graph_or_eager_us(fn) -> float:
    """The CUDA-graph time; do_bench's eager median where the call cannot be captured."""
    try:
        return graph_us(fn)
    except Exception:  # noqa: BLE001 -- e.g. a compiled peer that refuses capture
        torch.cuda.synchronize()
        return _median_us(fn)


def tflops(flops: float, us: float) -> float:
    """TFLOP/s of ``flops`` done in ``us`` microseconds (nan where the time is not finite)."""
    return flops / (us * 1e-6) / 1e12 if math.isfinite(us) else math.nan


def speedup(base_us: float, us: float) -> float:
    """How many times faster ``us`` is than ``base_us`` (nan where ``us`` is not finite)."""
    return base_us / us if math.isfinite(us) else math.nan
