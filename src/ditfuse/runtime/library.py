"""Registering ditfuse's ops with the dispatcher at low host cost.

``torch.library.custom_op`` wraps every call in Python (an autograd kernel, per-argument
handling, an output-aliasing check): for qk_norm_rope's 26 arguments, on the CPU with the
launch stubbed, 79-80 us a call through a custom_op against 56-57 us through this module's
registration and 41-42 us for the eager public function
(CPU, launch stubbed, 2026-11-29; docs/design/host_cost.md). Inside a
compiled graph every ditfuse kernel is reached through its op, so at FLUX.1's 12 blocks a
step's host time passed its GPU time (H200, 2026-11-29: 32.5 vs 24.0 ms) and the patched +
compiled model ran slower than patched eager.

:func:`op` keeps custom_op's spelling (the schema inferred from the annotations,
``.register_fake``) but registers the implementation directly for the CPU and CUDA
dispatch keys: the dispatcher calls it from C++ (no autograd kernel: the public functions
refuse inputs that need gradients before they reach an op).
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch

_LIB = torch.library.Library("ditfuse", "DEF")  # noqa: TOR901 (kept alive for the process)


class _Op:
    def __init__(self, qualname: str, fn: Callable):
        self._qualname = qualname
        self._packet = getattr(torch.ops.ditfuse, qualname.split("::")[1])
        self.__doc__ = fn.__doc__

    def register_fake(self, fake: Callable) -> Callable:
        torch.library.register_fake(self._qualname, fake, lib=_LIB)
        return fake

    def __call__(self, *args, **kwargs):
        return self._packet(*args, **kwargs)


def op(qualname: str, *, mutates_args: Iterable[str] = ()) -> Callable[[Callable], _Op]:
    """``@op("ditfuse::name", mutates_args=(...))`` on an annotated function: define the op
    with the schema ``torch.library.infer_schema`` derives and implement it for CPU (the
    interpreter) and CUDA."""
    ns, name = qualname.split("::")
    if ns != "ditfuse":
        raise ValueError(f"ditfuse ops live in the ditfuse namespace, got {qualname!r}")

    def wrap(fn: Callable) -> _Op:
        schema = torch.library.infer_schema(fn, mutates_args=tuple(mutates_args))
        _LIB.define(name + schema)
        for key in ("CPU", "CUDA"):
            _LIB.impl(name, fn, key)
        return _Op(qualname, fn)

    return wrap
