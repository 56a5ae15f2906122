"""Where a step's GPU time goes: each kernel of one profiled call put in a class by its name.

``ditfuse bench --e2e --kernels`` adds, to every timed way, the kernel time of one call split
into attention, GEMM and everything else. Two ways that run the same attention (the linear
ways against each other) differ only outside it, and that part is what the split shows: the
GEMMs, and the quantizers, norms, activations and residuals around them.

The classes are a table of name patterns, tried in order; a kernel no pattern matches is
"other". The names are those of the profiler's CUDA kernel events: cuDNN's and FlashAttention's
attention, ditfuse's attention kernels, cuBLAS / cuBLASLt GEMMs (``nvjet``, ``sm90_xmma``,
CUTLASS) and ditfuse's FP8 GEMM (``_gemm_fp8_rows_kernel``), and Inductor's or Triton's
kernels by their function names.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

import torch

#: (class, pattern) in the order tried; patterns search the kernel's name, case-insensitive.
#: The attention's input quantizers (ditfuse's ``_qk_quant_kernel``, ``_v_quant_kernel``, ...)
#: are not attention kernels: they fall through to "other".
KERNEL_CLASSES: tuple[tuple[str, str], ...] = (
    (
        "attention",
        r"_attention_8bit(_ws)?_kernel|_swa_(fwd|diff_sm90)_kernel|fmha|flash_?(fwd|fprop)"
        r"|sdpa|attn_fwd|flash_attention|cutlass.*attention",
    ),
    ("GEMM", r"gemm|nvjet|xmma|cutlass|cublas|gemv|splitkreduce"),
)
CLASSES: tuple[str, ...] = tuple(c for c, _ in KERNEL_CLASSES) + ("other",)
_COMPILED = tuple((c, re.compile(p, re.IGNORECASE)) for c, p in KERNEL_CLASSES)


def kernel_class(name: str) -> str:
    """The class of the kernel named ``name``: the first of :data:`KERNEL_CLASSES` whose
    pattern it contains, else ``"other"``."""
    for cls, pat in _COMPILED:
        if pat.search(name):
            return cls
    return "other"


def time_by_class(kernels: Iterable[tuple[str, float]]) -> dict[str, float]:
    """Sum of ``(name, us)`` pairs by :func:`kernel_class`, in ms, every class of
    :data:`CLASSES` present (0.0 where none ran)."""
    out = dict.fromkeys(CLASSES, 0.0)
    for name, us in kernels:
        out[kernel_class(name)] += us / 1e3
    return out


def profiled_kernels(fn: Callable[[], object]) -> list[tuple[str, float]]:
    """(name, us) of every CUDA kernel (and memcpy / memset) ``fn()`` runs, from
    ``torch.profiler`` over one call (the caller has warmed ``fn`` up; a compiled model
    compiles on its first call)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [
        (e.name, e.time_range.elapsed_us())
        for e in prof.events()
        if e.device_type == DeviceType.CUDA
    ]


def format_split(split: dict[str, float]) -> str:
    """``kernels of a call: attention 113.08, GEMM 55.42, other 21.64 ms (190.14)``."""
    parts = ", ".join(f"{c} {split[c]:.2f}" for c in CLASSES)
    return f"kernels of a call: {parts} ms ({sum(split.values()):.2f})"
