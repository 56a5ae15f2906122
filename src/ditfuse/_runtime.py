"""Where kernels run: the GPU when there is one, else Triton's interpreter on the CPU.

Triton reads ``TRITON_INTERPRET`` when a ``@triton.jit`` function is *defined*, so this
module must run before any ditfuse kernel module is imported (``ditfuse/__init__.py``
imports it first).
"""
from __future__ import annotations

import contextlib
import os
import threading

import torch


def _setup_interpreter() -> bool:
    """Turn on Triton's interpreter when no CUDA device is present; return whether it is on."""
    if os.environ.get("TRITON_INTERPRET") is None and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


INTERPRET: bool = _setup_interpreter()


def kernel_device_ok(t: torch.Tensor) -> bool:
    """True when a Triton kernel can run on ``t``'s device in this process."""
    if INTERPRET:
        return t.device.type == "cpu"
    return t.device.type == "cuda"


def describe_backend() -> str:
    if INTERPRET:
        return "triton-interpreter (cpu)"
    if torch.cuda.is_available():
        return f"cuda ({torch.cuda.get_device_name()})"
    return "cpu (pytorch reference)"


_MMA_ENV = "DISABLE_MMA_V3"
_MMA_LOCK = threading.Lock()


@contextlib.contextmanager
def _mma_sync_env():
    with _MMA_LOCK:
        old = os.environ.get(_MMA_ENV)
        os.environ[_MMA_ENV] = "1"
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(_MMA_ENV, None)
            else:
                os.environ[_MMA_ENV] = old


def mma_sync_only(on: bool):
    """Kernels that Triton compiles inside lower every ``tl.dot`` to ``mma.sync`` instead of
    Hopper's ``wgmma`` (Triton's ``DISABLE_MMA_V3`` switch, read when a kernel compiles and
    one of the variables its on-disk cache is keyed on, so the two builds are cached apart).
    Used for a launch whose specialization asks for it (a constexpr keeps its in-memory cache
    entry apart); a plain ``nullcontext`` when ``on`` is false (every other launch)."""
    return _mma_sync_env() if on else contextlib.nullcontext()
