"""A cheaper repeat launch of a Triton kernel than ``JITFunction.__getitem__``.

Triton's launcher re-derives the specialization of every argument and a string cache key
on each call, which for a kernel of ~60 arguments costs ~90 us of host time on the H200
machine (benchmarks/NOTES.md). Here the compiled kernel is cached under a key of exactly
what Triton specializes on (each tensor's dtype and 16-byte alignment; each int's class:
0, 1, divisible by 16, 32- or 64-bit) plus the constexprs and options, and relaunched
directly. The first call of each key goes through Triton (which compiles or finds it).
"""
from __future__ import annotations

import torch

from . import _runtime

_CACHE: dict = {}


def _arg_key(a):
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.data_ptr() % 16 == 0)
    if isinstance(a, bool):
        return ("b", a)
    if isinstance(a, int):
        return (a == 0, a == 1, a % 16 == 0, -(2**31) <= a < 2**31)
    if isinstance(a, float):
        return "f"
    return (type(a), a)


def launch(kernel, grid, args, constexprs: dict, **options) -> None:
    """``kernel[grid](*args, **constexprs, **options)``, with the repeat path cached.

    ``args`` are the leading (run-time) parameters in order; ``constexprs`` the rest.
    """
    if _runtime.INTERPRET:
        kernel[grid](*args, **constexprs, **options)
        return
    from triton import knobs

    hooks = knobs.runtime.launch_enter_hook is not None or knobs.runtime.launch_exit_hook is not None
    dev = args[0].device.index
    key = (id(kernel), dev, tuple(_arg_key(a) for a in args),
           tuple(constexprs.items()), tuple(sorted(options.items())))
    ck = _CACHE.get(key)
    if ck is None or hooks:
        ck = kernel[grid](*args, **constexprs, **options)
        if not hooks:
            _CACHE[key] = (ck, [constexprs[n] for n in kernel.arg_names[len(args):]])
        return
    ck, tail = ck
    g = tuple(grid) + (1,) * (3 - len(grid))
    stream = torch._C._cuda_getCurrentRawStream(dev)
    ck.run(g[0], g[1], g[2], stream, ck.function, ck.packed_metadata, None, None, None,
           *args, *tail)
