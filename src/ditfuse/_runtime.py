"""Where kernels run: the GPU when there is one, else Triton's interpreter on the CPU.

Triton reads ``TRITON_INTERPRET`` when a ``@triton.jit`` function is *defined*, so this
module must run before any ditfuse kernel module is imported (``ditfuse/__init__.py``
imports it first).
"""
from __future__ import annotations

import os

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
