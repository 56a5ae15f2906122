"""Cheap repeat calls: record a call's kernel launches once, replay them for calls of the
same signature.

An eager ditfuse call pays for argument checks, launch-setting tables and Triton's
``JITFunction.run`` (argument binding, cache key) on every call: several times an eager
torch op's host cost, enough for a patched step of short kernels to wait on the host
(docs/design/host_cost.md). A diffusion model calls each op with the same shapes every step,
so each op keys its calls by a *signature*: every tensor argument's shape, strides, dtype,
device and 16-byte alignment, and every scalar option. Everything the slow path derives
(the checks' verdict, grid, integer arguments, constexprs, Triton's specialization) is a
function of the signature, so the first call of a signature runs the slow path while
:class:`Recorder` notes its launches, and later calls reuse them: each tensor argument of
a launch is replaced by the call's tensor it was at record time (matched by address and
dtype), and the compiled kernel is launched through its C launcher. An op whose launches
take scratch it allocates (GroupNorm's partials) passes that scratch as call tensors too,
allocated afresh for each replay. Calls whose launches take anything else (a tensor that
is none of the call's, a TMA descriptor) or whose tensors alias one another at record time
are not cached: they keep the slow path.

Recording is per thread (threads running models at once each record their own calls).
Under Triton's interpreter (the CPU tests) a replay launches through the interpreter with
the same substituted arguments, so every test that repeats a signature exercises replay.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Optional

import torch

from ditfuse.runtime import backend
from ditfuse.runtime.backend import INTERPRET

#: Off: every call takes the slow path (for sweeps that change launch tables at run time).
ENABLED = True
MAX_ENTRIES = 512

_tls = threading.local()  # .rec: the launches being recorded on this thread, or None


def _rec() -> Optional[list]:
    return getattr(_tls, "rec", None)


def usable(x) -> bool:
    """Whether a call led by tensor ``x`` may be keyed: the cache is on and ``x`` is a real
    tensor on a device the kernels run on (not meta: ``ditfuse inspect`` and ``export``
    call the ops on meta tensors with the launch intercepted)."""
    return ENABLED and isinstance(x, torch.Tensor) and not x.is_meta and backend.kernel_device_ok(x)


def sig(t) -> tuple | None:
    """The part of a tensor argument a recorded call depends on (not its data)."""
    if t is None:
        return None
    return (t.shape, t.stride(), t.dtype, t.device, t.data_ptr() & 15)


def launch(kernel, grid, args: tuple, kwargs: dict) -> None:
    """``kernel[grid](*args, **kwargs)``, noted by the active :class:`Recorder`, if any."""
    compiled = kernel[grid](*args, **kwargs)
    rec = _rec()
    if rec is not None:
        if hasattr(compiled, "result"):  # Triton's asynchronous compile mode
            compiled = compiled.result()
        rec.append((kernel, grid, args, kwargs, compiled))


class Recorder:
    """``with Recorder() as rec: slow_path()`` notes the launches ``slow_path`` makes through
    :func:`launch`; ``rec.replay(tensors)`` then builds the replay for a call whose tensor
    arguments are ``tensors`` (None where absent), or None when it cannot."""

    def __enter__(self):
        self._outer = _rec()
        _tls.rec = self.launches = []
        return self

    def __exit__(self, *exc):
        _tls.rec = self._outer
        if self._outer is not None:  # an op recorded inside another op's slow path
            self._outer.extend(self.launches)

    def replay(self, tensors) -> Optional["Replay"]:
        slots: dict = {}
        for i, t in enumerate(tensors):
            if t is None or t.numel() == 0:
                continue
            key = (t.data_ptr(), t.dtype)
            slots[key] = -1 if key in slots else i  # -1: aliased, ambiguous
        out = []
        for kernel, grid, args, kwargs, compiled in self.launches:
            if callable(grid):
                return None
            template, subs = list(args), []
            for pos, a in enumerate(args):
                if isinstance(a, torch.Tensor):
                    i = slots.get((a.data_ptr(), a.dtype), -1)
                    if i < 0:
                        return None
                    template[pos] = None
                    subs.append((pos, i))
                elif _is_descriptor(a):
                    # a TMA descriptor of a view of a call's tensor: rebuilt at each replay
                    # over that slot's tensor (same shape / strides: the replay key's)
                    i = slots.get((a.base.data_ptr(), a.base.dtype), -1)
                    if i < 0:
                        return None
                    subs.append((pos, (i, a)))
                elif not isinstance(a, (int, float, bool)):
                    return None
            out.append(_Launch(kernel, grid, template, tuple(subs), kwargs, compiled))
        dev = torch.cuda.current_device() if not INTERPRET and torch.cuda.is_available() else -1
        return Replay(tuple(out), dev)


def _is_descriptor(a) -> bool:
    """A host TMA descriptor (Triton's / Gluon's ``TensorDescriptor``: a dataclass over a
    ``base`` tensor)."""
    return dataclasses.is_dataclass(a) and isinstance(getattr(a, "base", None), torch.Tensor)


def _rebase(desc, t: torch.Tensor):
    """``desc`` over the memory of ``t`` (the call's tensor whose view it describes: its
    address; the view's shape and strides stay the descriptor's). A field copy, not
    ``dataclasses.replace``: the descriptor's checks ran when it was recorded, and ``t``
    has the recorded tensor's signature (the replay key), its address's alignment too
    (a fraction of the re-validated copy's host cost: docs/design/host_cost.md)."""
    if desc.base is t:
        return desc
    new = object.__new__(type(desc))
    new.__dict__.update(desc.__dict__)
    new.base = t
    return new


class _Launch:
    __slots__ = ("kernel", "grid", "template", "subs", "kwargs", "compiled", "tail")

    def __init__(self, kernel, grid, template, subs, kwargs, compiled):
        self.kernel, self.grid, self.template, self.subs = kernel, grid, template, subs
        self.kwargs, self.compiled = kwargs, compiled
        # the launcher takes every parameter: the positional ones, then the constexprs
        params = getattr(kernel, "params", None)
        self.tail = (
            ()
            if params is None
            else tuple(
                kwargs[p.name] if p.name in kwargs else p.default for p in params[len(template) :]
            )
        )
        self.grid = tuple(grid) + (1,) * (3 - len(grid))

    def args(self, tensors) -> list:
        """The recorded arguments with the call's ``tensors`` in their slots (a slot ``(i,
        descriptor)``: that descriptor over ``tensors[i]``)."""
        args = self.template.copy()
        for pos, i in self.subs:
            args[pos] = tensors[i] if type(i) is int else _rebase(i[1], tensors[i[0]])
        return args


class Replay:
    """The launches of one recorded call, for the calls of the same signature."""

    __slots__ = ("launches", "device")

    def __init__(self, launches, device: int):
        self.launches, self.device = launches, device

    def __call__(self, tensors) -> bool:
        """Launch with ``tensors`` in the recorded slots; False (nothing launched) when the
        current device is not the recorded one."""
        if INTERPRET:
            for ln in self.launches:
                ln.kernel[ln.grid](*ln.args(tensors), **ln.kwargs)
            return True
        from triton import knobs
        from triton.runtime import driver

        dev = driver.active.get_current_device()
        if dev != self.device:
            return False
        stream = driver.active.get_current_stream(dev)
        enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        hooked = bool(enter.calls or leave.calls)
        for ln in self.launches:
            args = ln.args(tensors)
            ck, g = ln.compiled, ln.grid
            meta = ck.launch_metadata(g, stream, *args, *ln.tail) if hooked else None
            ck.run(
                g[0],
                g[1],
                g[2],
                stream,
                ck.function,
                ck.packed_metadata,
                meta,
                enter if hooked else None,
                leave if hooked else None,
                *args,
                *ln.tail,
            )
        return True


class Cache:
    """Signature -> :class:`Replay` for one op (bounded: cleared when full)."""

    def __init__(self):
        self._d: dict = {}

    def get(self, key):
        # while another op records, replays would hide launches from it: no hits then
        return self._d.get(key) if ENABLED and _rec() is None else None

    def put(self, key, replay: Optional[Replay]) -> None:
        if replay is None or not ENABLED:
            return
        if len(self._d) >= MAX_ENTRIES:
            self._d.clear()
        self._d[key] = replay

    def clear(self) -> None:
        self._d.clear()

    def __len__(self):
        return len(self._d)
