"""Where ditfuse's kernels run: the GPU when there is one, else Triton's interpreter on the CPU.

Triton picks compiled or interpreted code when a ``@triton.jit`` function is *defined*
(``TRITON_INTERPRET``). ditfuse does not change that for the process: its kernels are
defined through :func:`jit`, which builds interpreted kernels when ``TRITON_INTERPRET=1``
is set or no CUDA device is present, and compiled ones otherwise. Other Triton code in the
process keeps whatever the environment says.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading

import torch
import triton


def _interpret() -> bool:
    env = os.environ.get("TRITON_INTERPRET")
    if env is not None:
        return env not in ("", "0")
    return not torch.cuda.is_available()


#: ditfuse's kernels run through Triton's interpreter (on CPU tensors) in this process
INTERPRET: bool = _interpret()


_STDLIB_LOCK = threading.RLock()


@contextlib.contextmanager
def _interpreted_stdlib():
    """While one of ditfuse's interpreted kernels runs: Triton's own ``@triton.jit`` library
    functions (``tl.sum``, ``tl.max``, their combine functions) as interpreted ones too.

    Triton builds those when ``triton.language`` is first imported, compiled unless
    ``TRITON_INTERPRET`` was set then; a compiled one refuses to be called from interpreted
    code. The interpreter itself swaps ``tl``'s builtins for the duration of a launch and
    restores them after; this does the same for the library functions, so that nothing
    outside ditfuse's own launches changes."""
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    try:  # Gluon wraps tl.standard's functions at its import, which argument mangling
        import triton.experimental.gluon  # noqa: F401  (triggers): import it before the swap
    except ImportError:  # pragma: no cover
        pass
    with _STDLIB_LOCK:
        saved = []
        for mod in (tl, tl.standard):
            for name, member in list(vars(mod).items()):
                if isinstance(member, JITFunction):
                    saved.append((mod, name, member))
                    setattr(mod, name, _interpreted(member))
        try:
            yield
        finally:
            for mod, name, member in reversed(saved):
                setattr(mod, name, member)


_INTERPRETED: dict = {}

#: a thread's running interpreted launches: the ``triton.language`` modules each patched
_LAUNCHES = threading.local()


def _interpreted(f):
    hit = _INTERPRETED.get(f)
    if hit is None:
        hit = _INTERPRETED[f] = _kernel_class()(f.fn)
    return hit


@functools.lru_cache(maxsize=None)
def _lang_modules(fn) -> frozenset:
    """The ``triton.language`` modules (``tl``, ``tl.core``) in ``fn``'s globals: what the
    interpreter patches for it."""
    import triton.language as tl

    return frozenset(id(v) for v in fn.__globals__.values() if v is tl or v is tl.core)


@functools.lru_cache(maxsize=None)
def _kernel_class():
    """One subclass for every interpreted kernel and device function of ditfuse's, and of
    Triton's library functions while they run (built on first use).

    A launch patches ``triton.language``'s builtins for its grid (and restores them after).
    Triton's interpreter patches them again at every device-function call -- an
    ``inspect.getmembers`` over ``tl``, ``tl.tensor`` and ``tl.math`` each time, never
    restored -- which was ~40% of the interpreted time of a whole-model test, one call of
    each helper a program (docs/design/testing.md). A call whose modules the running launch
    has patched already (or an earlier call in it: Triton's patch stays) skips that; any
    other call patches as Triton does."""
    from triton.runtime.interpreter import InterpretedFunction, InterpreterError

    class _Interpreted(InterpretedFunction):
        def run(self, *args, **kwargs):
            stack = _LAUNCHES.__dict__.setdefault("stack", [])
            with _interpreted_stdlib():
                stack.append(_lang_modules(self.fn))
                try:
                    return super().run(*args, **kwargs)
                finally:
                    stack.pop()

        def __call__(self, *args, **kwargs):
            stack = getattr(_LAUNCHES, "stack", None)
            langs = _lang_modules(self.fn)
            if not stack or not langs <= stack[-1]:
                if stack:  # Triton's patch of these stays (it is never restored)
                    stack[-1] = stack[-1] | langs
                return super().__call__(*args, **kwargs)
            fn = self.rewrite()
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # as Triton's own device-function call reports it
                raise InterpreterError(repr(e)) from e

    return _Interpreted


def jit(fn=None, **kwargs):
    """``triton.jit`` for ditfuse's kernels: an interpreted kernel when :data:`INTERPRET`,
    whatever ``TRITON_INTERPRET`` says, else a compiled one. Same keyword arguments."""
    if not INTERPRET:
        return triton.jit(fn, **kwargs)
    cls = _kernel_class()

    def wrap(f):
        return cls(f, **kwargs)

    return wrap if fn is None else wrap(fn)


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
    Hopper's ``wgmma``; a plain ``nullcontext`` when ``on`` is false (every other launch).

    The one environment toggle in ditfuse, and why it stays one: Triton 3.6 has no compile
    option for it. Its compiler's C++ passes read ``DISABLE_MMA_V3`` from the environment when
    a kernel compiles (``CUDAOptions`` has no such field, and another ``arch`` option would
    change the whole target, not the dots); the variable is one its on-disk cache is keyed
    on, so the two builds are cached apart there. The in-memory cache is keyed on the
    specialization only: a kernel compiled inside takes a constexpr that says so (the band
    attention kernel's ``MMA_SYNC``, read by no code), which keeps that entry apart. The
    variable is set under a lock and restored on exit."""
    return _mma_sync_env() if on else contextlib.nullcontext()
