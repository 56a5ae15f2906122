"""Registering ditfuse's ops with the dispatcher at low host cost.

``torch.library.custom_op`` wraps every call in Python (an autograd kernel, per-argument
handling, an output-aliasing check). Inside a compiled graph every ditfuse kernel is reached
through its op, so that wrapper's cost is paid at every kernel of a step: enough for a
patched + compiled model's host time to pass its GPU time (docs/design/host_cost.md).

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
