"""Fused MLP activations: SwiGLU (FLUX.2's ``Flux2SwiGLU``) and GELU (FLUX.1's single-stream
``act_mlp``): launch table, launcher, public functions.

Layout: the Triton kernel is in :mod:`ditfuse.kernels.activations`; this module holds the
launch table (``launch_settings``), validation -> allocation -> launch, the public
functions :func:`swiglu` and :func:`gelu`, and at its end their ``torch.library`` ops (with
fake implementations; eager calls launch directly, only code being compiled goes through
the ops). The pure-PyTorch references (the test oracle and the fallback for devices Triton
cannot run on) are in :mod:`ditfuse.reference`. Inference only. Measurements behind the
table: docs/design/activations.md.

One kernel over a 2-D row view: rows are every leading dimension flattened (they must be
addressable with one row stride: a column slice ``proj[..., a:b]`` of a wider projection
is read in place), columns the channels (unit stride). The output may be a column slice of
a wider buffer (``out=buf[..., inner:]``), so the activation lands in the concat buffer the
next projection reads: no separate ``torch.cat`` copy.

Bytes model: read x, write y. SwiGLU reads ``2H`` and writes ``H`` elements a row, where
eager PyTorch moves ``5H`` (``silu`` reads ``H``, writes ``H``; the product reads ``2H``,
writes ``H``); GELU reads ``N`` and writes ``N``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from ditfuse.kernels import activations as _kernels
from ditfuse.kernels.activations import _act_kernel
from ditfuse.runtime import backend, fastpath, library

ACT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: what the kernel computes: its ``KIND`` codes
SWIGLU = _kernels.SWIGLU.value
GELU_TANH = _kernels.GELU_TANH.value
GELU_ERF = _kernels.GELU_ERF.value
GELU_KINDS = {"tanh": GELU_TANH, "none": GELU_ERF}


@dataclass(frozen=True)
class ActSettings:
    """How ``_act_kernel`` is launched: ``rows`` x ``block`` outputs a program."""

    rows: int
    block: int
    num_warps: int


def launch_settings(N: int) -> ActSettings:
    """Launch settings for rows of N output columns (the sweep behind the table:
    docs/design/activations.md): a tile of up to 2048 columns (18432 = 9 x 2048, 12288 =
    6 x 2048: no masked lanes at the FLUX widths; 4096-column tiles were slower), rows
    added until a program holds about 2048 outputs (at most 64 rows), a warp for each 512
    of them (16 a thread), at most 4."""
    block = min(2048, triton.next_power_of_2(max(N, 1)))
    rows = max(1, min(64, 2048 // block))
    return ActSettings(rows=rows, block=block, num_warps=max(1, min(4, rows * block // 512)))


# ---------------------------------------------------------------------------------------
# validation -> allocation -> launch


def row_stride(t: torch.Tensor):
    """The one stride between consecutive rows of ``t`` seen as (rows, t.shape[-1]) with
    unit column stride, or None when ``t`` cannot be addressed that way."""
    shape, st = t.shape, t.stride()
    if shape[-1] > 1 and st[-1] != 1:
        return None
    rs = expect = None
    for size, stride in zip(reversed(shape[:-1]), reversed(st[:-1])):
        if size == 1:
            continue
        if rs is None:
            rs = stride
        elif stride != expect:
            return None
        expect = stride * size
    return shape[-1] if rs is None else rs


def _rows(t: torch.Tensor, name: str) -> int:
    rs = row_stride(t)
    if rs is None:
        raise ValueError(
            f"{name} (shape {tuple(t.shape)}, strides {tuple(t.stride())}) must have unit stride "
            f"in its last dimension and leading dimensions that flatten to one row stride "
            f"(a contiguous tensor or a column slice such as proj[..., a:b]); ditfuse makes no "
            f"hidden copy: pass {name}.contiguous() if that is what you want"
        )
    return rs


def _width(W: int, kind: int) -> int:
    """Output channels for ``W`` input channels (SwiGLU halves them)."""
    return W // 2 if kind == SWIGLU else W


def _plan(x, kind: int):
    """Check x; returns (rows, output columns, x's row stride)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in ACT_DTYPES:
        raise TypeError(f"x.dtype must be float16, bfloat16 or float32, got {x.dtype}")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension (the channels), got a scalar")
    W = x.shape[-1]
    if kind == SWIGLU and W % 2:
        raise ValueError(
            f"swiglu: x.shape[-1] must be even ([gate input | value] halves), "
            f"got {W} (shape {tuple(x.shape)})"
        )
    return x.numel() // W if W else 0, _width(W, kind), _rows(x, "x")


def _check_out(out, x, N: int, R: int) -> int:
    want = tuple(x.shape[:-1]) + (N,)
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if out.dtype != x.dtype:
        raise TypeError(f"out.dtype must be x's dtype {x.dtype}, got {out.dtype}")
    if out.device != x.device:
        raise ValueError(f"out is on {out.device}, x is on {x.device}")
    if tuple(out.shape) != want:
        raise ValueError(
            f"out has shape {tuple(out.shape)}; expected {want} (x's leading "
            f"dimensions, {N} channels), e.g. a column slice buf[..., a:a + {N}]"
        )
    rs = _rows(out, "out")
    if R > 1 and rs < N:
        raise ValueError(
            f"out's rows overlap (row stride {rs} < {N} channels: an expanded "
            f"view?); pass a tensor or a slice with distinct elements"
        )
    return rs


def _new(x, N):
    return torch.empty(tuple(x.shape[:-1]) + (N,), dtype=x.dtype, device=x.device)


_CACHE = fastpath.Cache()


def _run(x, kind: int, out=None, settings: ActSettings | None = None):
    """Validate, allocate, launch (or the reference where Triton cannot run).
    ``settings`` overrides the table (sweeps). A call whose signature was seen before
    replays its launch (:mod:`ditfuse.runtime.fastpath`)."""
    key = None
    if fastpath.usable(x):
        try:
            key = (kind, settings, launch_settings, fastpath.sig(x), fastpath.sig(out))
            replay = _CACHE.get(key)
        except (AttributeError, TypeError):
            key = replay = None
        if replay is not None:
            o = out if out is not None else _new(x, _width(x.shape[-1], kind))
            if replay((x, o)):
                return o
    R, N, sx = _plan(x, kind)
    so = N
    if out is not None:
        so = _check_out(out, x, N, R)
    else:
        out = _new(x, N)
    if R == 0 or N == 0:
        return out
    if backend.kernel_device_ok(x):
        st = settings or launch_settings(N)
        with fastpath.Recorder() as rec:
            fastpath.launch(
                _act_kernel,
                (triton.cdiv(R, st.rows), triton.cdiv(N, st.block)),
                (x, out, R, N, sx, so),
                dict(KIND=kind, ROWS=st.rows, BLOCK=st.block, num_warps=st.num_warps),
            )
        if key is not None:
            _CACHE.put(key, rec.replay((x, out)))
    else:
        from ditfuse.reference import gelu_reference, swiglu_reference

        out.copy_(
            swiglu_reference(x)
            if kind == SWIGLU
            else gelu_reference(x, "tanh" if kind == GELU_TANH else "none")
        )
    return out


def supported(x, op: str = "swiglu") -> bool:
    """Whether the kernel computes ``op`` ("swiglu" / "gelu") of ``x`` as given: a tensor of a
    supported dtype on a device the kernels run on, addressable as rows (see
    :func:`row_stride`), an even width for SwiGLU, no autograd. The patched modules run the
    original code otherwise."""
    return (
        isinstance(x, torch.Tensor)
        and x.dtype in ACT_DTYPES
        and x.dim() > 0
        and backend.kernel_device_ok(x)
        and row_stride(x) is not None
        and (op != "swiglu" or x.shape[-1] % 2 == 0)
        and not (torch.is_grad_enabled() and x.requires_grad)
    )


def _no_grad_check(x):
    if torch.is_grad_enabled() and isinstance(x, torch.Tensor) and x.requires_grad:
        raise RuntimeError(
            "ditfuse activation ops are inference-only (no backward): call them "
            "under torch.no_grad() or torch.inference_mode()"
        )


def swiglu(x, *, out=None):
    r"""SwiGLU as FLUX.2 computes it: ``y = silu(x[..., :H]) * x[..., H:]``, ``H = W // 2``.

    .. math:: y = \mathrm{rnd}\left(\mathrm{rnd}\left(\frac{x_1}{1 + e^{-x_1}}\right) x_2\right)

    Parameters
    ----------
    x : Tensor
        ``(..., 2H)``, fp16 / bf16 / fp32: the gate input ``x1`` then the value ``x2``
        (``Flux2FeedForward.linear_in``'s output, or the MLP columns of FLUX.2's fused
        ``to_qkv_mlp_proj`` output, read in place as a column slice). Unit stride along the
        channels; the leading dimensions must flatten to one row stride.
    out : Tensor, optional
        Where to write ``y``: ``(..., H)``, x's leading shape, dtype and device, unit
        channel stride, any row stride — e.g. the MLP columns ``buf[..., inner:]`` of the
        buffer the output projection reads.

    Returns
    -------
    Tensor
        ``out``, or a new contiguous ``(..., H)`` tensor.

    Notes
    -----
    Contract: the arithmetic of diffusers' eager ``Flux2SwiGLU`` (``F.silu`` then ``*``) on
    CUDA, two roundings to x's dtype: ``silu`` in fp32 as ``x / (1 + exp(-x))`` (CUDA's
    ``expf``, IEEE division), rounded; the product in fp32, rounded. On the GPU it is the
    same arithmetic as eager PyTorch; through Triton's interpreter (numpy's ``exp``) it can
    differ from torch's CPU ``silu`` where the two ``exp`` differ in their last bit. Within
    one rounding of the dtype per eager op of the fp64 value. Inference only (no backward).

    Examples
    --------
    >>> with torch.no_grad():
    ...     h = ff.linear_in(x)                  # (B, S, 2 * 18432)
    ...     y = ditfuse.swiglu(h)                # (B, S, 18432)
    """
    _no_grad_check(x)
    if torch.compiler.is_compiling():
        if out is None:
            return torch.ops.ditfuse.swiglu(x)
        torch.ops.ditfuse.swiglu_out(x, out)  # mutating: inductor writes the caller's view
        return out
    return _run(x, SWIGLU, out)


def gelu(x, approximate: str = "tanh", *, out=None):
    r"""GELU in one pass: ``F.gelu(x, approximate=approximate)``, optionally into a slice.

    .. math:: y = \tfrac12 x\left(1 + \tanh\left(\sqrt{2/\pi}\,(x + 0.044715\,x^3)\right)\right)
              \quad\text{or}\quad y = \tfrac12 x\left(1 + \mathrm{erf}(x/\sqrt2)\right)

    Parameters
    ----------
    x : Tensor
        ``(..., N)``, fp16 / bf16 / fp32, unit channel stride, leading dimensions that
        flatten to one row stride (FLUX.1's ``proj_mlp`` output).
    approximate : {"tanh", "none"}
        As ``torch.nn.GELU`` (FLUX.1's single-stream ``act_mlp`` is ``"tanh"``).
    out : Tensor, optional
        ``(..., N)``, x's leading shape, dtype and device, unit channel stride, any row
        stride: e.g. ``buf[..., attn_dim:]``, the MLP half of the single-stream block's
        concat buffer.

    Returns
    -------
    Tensor
        ``out``, or a new contiguous tensor.

    Notes
    -----
    Contract: PyTorch's formula in PyTorch's order, in fp32, rounded once to x's dtype: within
    one rounding of the fp64 formula plus the fp32 evaluation error, which matters only
    where ``1 + tanh`` (``1 + erf``) cancels, for ``x`` below about -3 — there the absolute
    error is a few fp32 ulps of ``|x|``, as in eager PyTorch. Bitwise equality with eager is
    *not* promised: the tanh / erf implementations (libdevice on the GPU; numpy /
    ``math.erf`` / an exp-based tanh under the interpreter) and fused multiply-adds may
    differ in the last fp32 bit, which changes the rounded result for a small share of
    elements (``tests/test_activations.py`` reports it). Inference only (no backward).

    Examples
    --------
    >>> with torch.no_grad():  # FLUX.1 single-stream block: the MLP half of the concat buffer
    ...     ditfuse.gelu(block.proj_mlp(x), "tanh", out=buf[..., attn_dim:])
    """
    if approximate not in GELU_KINDS:
        raise ValueError(f"approximate must be 'tanh' or 'none', got {approximate!r}")
    _no_grad_check(x)
    if torch.compiler.is_compiling():
        if out is None:
            return torch.ops.ditfuse.gelu(x, approximate)
        torch.ops.ditfuse.gelu_out(x, approximate, out)  # mutating: no copy into out
        return out
    return _run(x, GELU_KINDS[approximate], out)


# ---------------------------------------------------------------------------------------
# torch.library ops (used under torch.compile; eager calls launch directly)


@library.op("ditfuse::swiglu", mutates_args=())
def _swiglu_op(x: torch.Tensor) -> torch.Tensor:
    return _run(x, SWIGLU)


@_swiglu_op.register_fake
def _(x):
    _, N, _ = _plan(x, SWIGLU)
    return _new(x, N)


@library.op("ditfuse::gelu", mutates_args=())
def _gelu_op(x: torch.Tensor, approximate: str) -> torch.Tensor:
    return _run(x, GELU_KINDS[approximate])


@_gelu_op.register_fake
def _(x, approximate):
    _, N, _ = _plan(x, GELU_KINDS[approximate])
    return _new(x, N)


# The out= forms as mutating ops: under torch.compile the activation lands in the caller's
# view (a column slice of the concat buffer) with no functional result copied into it.
@library.op("ditfuse::swiglu_out", mutates_args=("out",))
def _swiglu_out_op(x: torch.Tensor, out: torch.Tensor) -> None:
    _run(x, SWIGLU, out)


@_swiglu_out_op.register_fake
def _(x, out):
    R, N, _ = _plan(x, SWIGLU)
    _check_out(out, x, N, R)


@library.op("ditfuse::gelu_out", mutates_args=("out",))
def _gelu_out_op(x: torch.Tensor, approximate: str, out: torch.Tensor) -> None:
    _run(x, GELU_KINDS[approximate], out)


@_gelu_out_op.register_fake
def _(x, approximate, out):
    R, N, _ = _plan(x, GELU_KINDS[approximate])
    _check_out(out, x, N, R)
