"""Fused AdaLN modulation and gated residual: launch settings, launchers, public functions.

[x + y * gate ->] norm -> * (1 + scale) + shift -> cast, one read of every input and one
write of every output. Rows of up to 8192 channels stay in registers (two-pass statistics
there), a few rows per 4-warp program (``_adaln_tile_kernel``); longer rows take the
one-row kernel's chunked path (``_adaln_kernel``), which combines per-chunk (count, mean,
M2) with Chan's formula and reads the row a second time. ``gated_residual`` is the first
step alone (Wan's FFN residual, which feeds the next block): on dense rows one flat
elementwise run a batch entry (``_residual_flat_kernel``), else the tile kernel; the same bits.

Layout: the Triton kernels are in :mod:`ditfuse.kernels.adaln`; this module holds the
launch table (``launch_settings``), validation -> allocation -> launch,
the public functions, and at its end their ``torch.library`` ops (with fake
implementations; eager calls launch directly, only code being compiled goes through the
ops). The pure-PyTorch reference (the test oracle and the fallback for devices Triton cannot
run on) is :func:`ditfuse.reference.adaln_reference`. Inference only. Measurements behind
the table: docs/design/adaln.md.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Optional

import torch
import triton

from ditfuse.kernels.adaln import (
    LAYER_NORM,
    NO_NORM,
    RMS_NORM,
    AdaLNFlags,
    RowStrides,
    _adaln_fp8_tile_kernel,
    _adaln_kernel,
    _adaln_tile_kernel,
    _residual_flat_kernel,
)
from ditfuse.norms import check_affine
from ditfuse.ops.quantize_rows import FP8, Rows8, quantize_rows
from ditfuse.reference import AdaLNOptions, adaln_reference
from ditfuse.runtime import backend, fastpath, library

ACT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
NORMS = {None: NO_NORM.value, "layer": LAYER_NORM.value, "rms": RMS_NORM.value}
ROUNDINGS = ("once", "per_op")
#: ``quantize=`` values: the modulated output as it is, or in e4m3 a token at a time
QUANTIZE = (None, "fp8")
#: offsets within a batch entry past which the flat residual kernel computes in int64
OFF64_AT = 2**31
#: a CUDA grid's second and third axes hold at most 65535 programs
GRID_Y_MAX = 65535
#: the public functions' defaults (``norm``, ``eps``, ``rounding``), written once
DEFAULTS = AdaLNOptions()


# ---------------------------------------------------------------------------------------
# launch settings: an analytical table, no autotuning


@dataclass(frozen=True)
class AdaLNSettings:
    """How one call is launched. ``kernel`` "tile": ``rows`` rows a program, a row held as
    the power-of-two pieces ``block_a`` + ``block_b`` (5120 = 4096 + 1024; ``block_b`` 0
    when D is a power of two); "rows": one long row a program, in ``num_chunks`` chunks of
    ``block``; "flat": the gated residual alone over dense rows, ``block`` values a
    program (fields a kernel does not read are 0)."""

    kernel: str
    num_warps: int
    rows: int
    block_a: int
    block_b: int
    block: int
    num_chunks: int


def launch_settings(D: int, *, flat: bool = False) -> AdaLNSettings:
    """Launch settings for rows of ``D > 0`` channels (the measurements behind the table:
    docs/design/adaln.md).

    * ``flat`` (the gated residual alone over dense rows): 1024 values a program on 4
      warps, 8 a thread (one 16-byte load of x and of y in 16-bit).
    * D <= 8192, the tile kernel: D as two power-of-two pieces; rows added until a program
      holds about 4096 elements (at most 16; one row from 3072 channels up): more, smaller
      programs keep more rows' loads in flight an SM. 4 warps while a thread holds at most
      40 elements of a row, else 8: at 48 a thread (FLUX.2's 6144 channels) a 4-warp build
      fits no more programs an SM than 8 warps.
    * Longer rows, the one-row kernel: chunks of 4096 on 8 warps.
    """
    if flat:
        return AdaLNSettings(
            kernel="flat", num_warps=4, rows=1, block_a=0, block_b=0, block=1024, num_chunks=0
        )
    if D > 8192:
        return AdaLNSettings(
            kernel="rows",
            num_warps=8,
            rows=1,
            block_a=0,
            block_b=0,
            block=4096,
            num_chunks=triton.cdiv(D, 4096),
        )
    a = 1 << (D.bit_length() - 1)  # the largest power of two <= D, then the rest
    b = triton.next_power_of_2(D - a) if D > a else 0
    rows = max(1, min(16, 4096 // (a + b)))
    return AdaLNSettings(
        kernel="tile",
        num_warps=4 if a + b <= 40 * 128 else 8,
        rows=1 << (rows.bit_length() - 1),
        block_a=a,
        block_b=b,
        block=0,
        num_chunks=0,
    )


def _batch_grid(blocks: int, B: int):
    """(grid, BATCH_X) for ``blocks`` programs a batch entry: (blocks, B), or (B, blocks)
    when B passes the grid's second axis (a 2-D (tokens, D) input is B rows of one token)."""
    if B <= GRID_Y_MAX:
        return (blocks, B), False
    if blocks > GRID_Y_MAX:
        raise ValueError(
            f"x: {B} batch entries of {blocks} programs each exceed a CUDA grid "
            f"(at most {GRID_Y_MAX} on one of the two axes); pass x as "
            f"(B, S, D) with fewer entries"
        )
    return (B, blocks), True


def _dense_rows(t: torch.Tensor) -> bool:
    B, S, D = t.shape
    return (t.stride(2) == 1 or D == 1) and (t.stride(1) == D or S == 1)


def _launch_residual_flat(x3, y3, g3, xn3, per_op) -> None:
    B, S, D = x3.shape
    st = launch_settings(D, flat=True)
    n = S * D
    gst = g3.stride() if g3 is not None else (0, 0, 0)
    # the gate's offsets within an entry: s * stride_gs + d * stride_gd (per token, Wan 2.2
    # TI2V's (B, S, 6, D) temb: 6 D values a token)
    gate_span = (S - 1) * abs(gst[1]) + (D - 1) * abs(gst[2]) + 1 if g3 is not None else 0
    args = (x3, y3, g3 if g3 is not None else x3, xn3, S, x3.stride(0), y3.stride(0), xn3.stride(0))
    grid, batch_x = _batch_grid(triton.cdiv(n, st.block), B)
    fastpath.launch(
        _residual_flat_kernel,
        grid,
        args,
        dict(
            gate_strides=gst,
            D=D,
            HAS_GATE=g3 is not None,
            BATCH_X=batch_x,
            GATE_PER_TOKEN=g3 is not None and S > 1 and g3.stride(1) != 0,
            PER_OP=per_op,
            EVEN=n % st.block == 0,
            OFF64=max(n + st.block, gate_span) >= OFF64_AT,
            BLOCK=st.block,
            num_warps=st.num_warps,
            enable_fp_fusion=False,
        ),
    )


# ---------------------------------------------------------------------------------------
# validation -> allocation -> launch


def _rows_view(x: torch.Tensor, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() == 2:
        return x[:, None, :]
    if x.dim() == 3:
        return x
    raise ValueError(f"{name} must be (B, S, D) or (B, D), got shape {tuple(x.shape)}")


def _mod_view(t, name: str, x3: torch.Tensor):
    """(B, S, D) broadcast view of shift / scale / gate, or None."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor")
    if t.device != x3.device:
        raise ValueError(f"{name} is on {t.device}, x is on {x3.device}")
    B, S, D = x3.shape
    if t.dim() == 1:
        v = t[None, None]
    elif t.dim() == 2:
        v = t[:, None]
    elif t.dim() == 3:
        v = t
    else:
        v = None
    if v is None or v.shape[0] not in (1, B) or v.shape[1] not in (1, S) or v.shape[2] != D:
        raise ValueError(
            f"{name} has shape {tuple(t.shape)}; expected (D,), (1|B, D), (1|B, 1, D) or "
            f"(1|B, S, D) with B={B}, S={S}, D={D} (a chunk of temb such as "
            f"temb.chunk(6, dim=1)[i] is fine as it is)"
        )
    return v.expand(B, S, D)


def _affine(p, name: str, D: int, x: torch.Tensor):
    if p is not None:
        check_affine(p, name, D, x, "x", f"D = {D}")
    return p


@dataclass
class Plan:
    """A checked call: (B, S, D) views of its tensors (None where absent) and its options."""

    x3: torch.Tensor
    y3: Optional[torch.Tensor]
    g3: Optional[torch.Tensor]  # gate
    sh3: Optional[torch.Tensor]  # shift
    sc3: Optional[torch.Tensor]  # scale
    weight: Optional[torch.Tensor]
    bias: Optional[torch.Tensor]
    norm: Optional[str]
    eps: float
    per_op: bool


def _plan(x, y, gate, shift, scale, o: AdaLNOptions) -> Plan:
    """Check every argument of a call (``o``: its options); raises before anything runs."""
    norm, weight, bias, eps, rounding = o
    x3 = _rows_view(x, "x")
    if x.dtype not in ACT_DTYPES:
        raise TypeError(f"x.dtype must be float16, bfloat16 or float32, got {x.dtype}")
    if norm not in NORMS:
        raise ValueError(f"norm must be 'layer', 'rms' or None, got {norm!r}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    if not (isinstance(eps, (int, float)) and eps >= 0):
        raise ValueError(f"eps must be a number >= 0, got {eps!r}")
    B, S, D = x3.shape
    y3 = None
    if y is not None:
        y3 = _rows_view(y, "y")
        if not y.is_floating_point():
            raise TypeError(f"y.dtype must be floating point, got {y.dtype}")
        if tuple(y3.shape) != tuple(x3.shape):
            raise ValueError(f"y.shape {tuple(y.shape)} must equal x.shape {tuple(x.shape)}")
        if y.device != x.device:
            raise ValueError(f"y is on {y.device}, x is on {x.device}")
    g3 = _mod_view(gate, "gate", x3)
    sh3 = _mod_view(shift, "shift", x3)
    sc3 = _mod_view(scale, "scale", x3)
    w = _affine(weight, "weight", D, x)
    bb = _affine(bias, "bias", D, x)
    if norm is None and (w is not None or bb is not None):
        raise ValueError("weight/bias given with norm=None")
    if rounding == "per_op":
        for name, t in (("shift", shift), ("scale", scale), ("gate", gate), ("y", y)):
            if t is not None and t.dtype != x.dtype:
                raise ValueError(
                    f"rounding='per_op' emulates a chain computed in x's dtype: "
                    f"{name}.dtype {t.dtype} must equal x.dtype {x.dtype}"
                )
    return Plan(x3, y3, g3, sh3, sc3, w, bb, norm, eps, rounding == "per_op")


def _launch(p: Plan, xn3, o3, settings=None, flat=True, qscale=None):
    """Launch plan ``p``'s kernel: ``xn3`` the new residual stream (None without ``y``),
    ``o3`` the modulated output (None: the gated residual alone). ``settings``: an
    :class:`AdaLNSettings` instead of ``launch_settings(D)`` (tests of other settings).
    ``flat=False``: the gated residual alone on dense rows through the tile kernel too
    (the same bits; its constexprs do not depend on the token count, as an ahead-of-time
    build needs). ``qscale``: ``o3`` is e4m3 and ``qscale`` (B * S,) its scales (the tile
    kernel's FP8 form; rows of up to 8192 channels)."""
    x3 = p.x3
    B, S, D = x3.shape
    if B * S == 0 or D == 0:
        return
    has_out = o3 is not None
    if flat and not has_out and p.y3 is not None and all(_dense_rows(t) for t in (x3, p.y3, xn3)):
        _launch_residual_flat(x3, p.y3, p.g3, xn3, p.per_op)
        return
    st = settings or launch_settings(D)
    dummy = x3
    o3 = o3 if has_out else dummy

    def opt(t):
        return t if t is not None else dummy

    def strides(t):
        return t.stride() if t is not None else (0, 0, 0)

    args = (
        x3,
        opt(p.y3),
        opt(p.g3),
        opt(p.sh3),
        opt(p.sc3),
        opt(p.weight),
        opt(p.bias),
        opt(xn3),
        o3,
        S,
        D,
        float(p.eps),
    )
    rows = (x3, p.y3, p.g3, p.sh3, p.sc3, xn3, o3)
    flags = AdaLNFlags(
        norm=NORMS[p.norm],
        has_w=p.weight is not None,
        has_b=p.bias is not None,
        residual=p.y3 is not None,
        has_gate=p.g3 is not None,
        has_shift=p.sh3 is not None,
        has_scale=p.sc3 is not None,
        per_op=p.per_op,
        has_out=has_out,
    )
    # the strides by keyword: a replayed launch substitutes the positional tensors only
    kw = dict(
        strides=RowStrides(*(strides(t) for t in rows)),
        FLAGS=flags,
        num_warps=st.num_warps,
        enable_fp_fusion=False,
    )
    if st.kernel == "tile":
        grid, batch_x = _batch_grid(triton.cdiv(S, st.rows), B)
        kernel = _adaln_tile_kernel
        if qscale is not None:
            kernel, args = _adaln_fp8_tile_kernel, args[:9] + (qscale,) + args[9:]
        fastpath.launch(
            kernel,
            grid,
            args,
            dict(kw, ROWS=st.rows, BLOCK_A=st.block_a, BLOCK_B=st.block_b, BATCH_X=batch_x),
        )
    else:
        fastpath.launch(
            _adaln_kernel, (B * S,), args, dict(kw, BLOCK_D=st.block, NUM_CHUNKS=st.num_chunks)
        )


def _new(x):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _outputs(x, y, inplace, out, modulated):
    """(x_new, modulated output) as the call returns them (``out`` checked by the caller)."""
    o = x_new = None
    if modulated:
        o = out if out is not None else _new(x)
        if y is not None:
            x_new = x if inplace else _new(x)
    else:
        x_new = out if out is not None else _new(x)
    return x_new, o


_CACHE = fastpath.Cache()


def _slots(x, y, gate, shift, scale, weight, bias, x_new, o):
    # an output that is x itself (inplace, out=x: in the key) is x's slot
    return (
        x,
        y,
        gate,
        shift,
        scale,
        weight,
        bias,
        None if x_new is x else x_new,
        None if o is x else o,
    )


def _residual_options(rounding: str) -> AdaLNOptions:
    """The options of the gated residual alone (no norm)."""
    return AdaLNOptions(norm=None, eps=0.0, rounding=rounding)


def _recorded(options: tuple, tensors: tuple):
    """(key, the recorded launches' replay or None) of a call with ``options`` on ``tensors``
    (the first one decides the fast path); (None, None) where :mod:`ditfuse.runtime.fastpath`
    is off for it or an argument is not a tensor / not hashable (the checks then explain)."""
    if not fastpath.usable(tensors[0]):
        return None, None
    try:
        key = options + tuple(fastpath.sig(t) for t in tensors)
        return key, _CACHE.get(key)
    except (AttributeError, TypeError):
        return None, None


def _run(
    x, y, gate, shift, scale, opts: AdaLNOptions, inplace=False, out=None, modulated=True, **launch
):
    """Validate, allocate, launch (or the reference off the GPU). Returns (x_new, out).
    ``opts``: the call's options (:class:`AdaLNOptions`; :func:`_residual_options` for the
    gated residual alone). ``modulated=False``: the gated residual alone; ``out`` is then
    where x_new goes.
    ``launch``: ``settings`` / ``flat`` for :func:`_launch`. A call whose signature was
    seen before replays its launches (:mod:`ditfuse.runtime.fastpath`)."""
    norm, weight, bias, eps, rounding = opts
    key, replay = _recorded(
        (norm, eps, rounding, bool(inplace), modulated, out is x, tuple(sorted(launch.items()))),
        (x, y, gate, shift, scale, weight, bias, out),
    )
    if replay is not None:
        x_new, o = _outputs(x, y, inplace, out, modulated)
        if replay(_slots(x, y, gate, shift, scale, weight, bias, x_new, o)):
            return x_new, o
    p = _plan(x, y, gate, shift, scale, opts)
    if out is not None:
        if (
            not isinstance(out, torch.Tensor)
            or out.shape != x.shape
            or out.dtype != x.dtype
            or out.device != x.device
        ):
            raise ValueError(
                f"out must be a {x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
            )
    x_new, o = _outputs(x, y, inplace, out, modulated)
    o3 = _rows_view(o, "out") if o is not None else None
    xn3 = _rows_view(x_new, "x_new") if x_new is not None else None
    if backend.kernel_device_ok(p.x3):
        with fastpath.Recorder() as rec:
            _launch(p, xn3, o3, **launch)
        if key is not None:
            _CACHE.put(key, rec.replay(_slots(x, y, gate, shift, scale, weight, bias, x_new, o)))
    else:
        res = adaln_reference(x, shift, scale, residual=y, gate=gate, **opts._asdict())
        if y is not None:
            x_new.copy_(res[0])
            res = res[1]
        if o is not None:
            o.copy_(res)
    return x_new, o


def _run_fp8(x, y, gate, shift, scale, opts: AdaLNOptions):
    """:func:`_run` with the modulated output in e4m3 a token at a time: (x_new or None,
    :class:`~ditfuse.ops.linear_fp8.Rows8`). One pass (the tile kernel's FP8 form) where the
    16-bit one is the tile kernel; else (longer rows, the reference off the GPU) the 16-bit
    output then :func:`~ditfuse.ops.linear_fp8.quantize_rows`: the same bits. A call whose
    signature was seen before replays its launch before any check, as :func:`_run` does."""

    def outputs():
        q = torch.empty(x.shape, dtype=FP8, device=x.device)
        qs = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
        x_new = _new(x) if y is not None else None
        slots = _slots(x, y, gate, shift, scale, opts.weight, opts.bias, x_new, q) + (qs,)
        return x_new, Rows8(q, qs, x.dtype), slots

    key, replay = _recorded(
        ("fp8", opts.norm, opts.eps, opts.rounding),
        (x, y, gate, shift, scale, opts.weight, opts.bias),
    )
    if replay is not None:
        x_new, r, slots = outputs()
        if replay(slots):
            return x_new, r
    p = _plan(x, y, gate, shift, scale, opts)
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"quantize='fp8' takes a float16 / bfloat16 x, got {x.dtype}")
    if not backend.kernel_device_ok(p.x3) or launch_settings(p.x3.shape[2]).kernel != "tile":
        x_new, o = _run(x, y, gate, shift, scale, opts)
        q, qs = quantize_rows(o)
        return x_new, Rows8(q.view(x.shape), qs.view(x.shape[:-1]), x.dtype)
    x_new, r, slots = outputs()
    with fastpath.Recorder() as rec:
        _launch(
            p,
            _rows_view(x_new, "x_new") if x_new is not None else None,
            _rows_view(r.q, "q"),
            qscale=r.scale,
        )
    if key is not None:
        _CACHE.put(key, rec.replay(slots))
    return x_new, r


def _check_quantize(quantize, inplace=False, out=None):
    if quantize not in QUANTIZE:
        raise ValueError(f"quantize must be None or 'fp8', got {quantize!r}")
    if quantize is not None and (inplace or out is not None):
        raise ValueError("quantize='fp8' writes new tensors: inplace / out are not supported")


def _no_grad_check(*ts):
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in ts):
        raise RuntimeError(
            "ditfuse AdaLN ops are inference-only (no backward): call them under "
            "torch.no_grad() or torch.inference_mode()"
        )


def adaln_modulate(
    x,
    shift=None,
    scale=None,
    *,
    norm=DEFAULTS.norm,
    weight=None,
    bias=None,
    eps=DEFAULTS.eps,
    rounding=DEFAULTS.rounding,
    out=None,
    quantize=None,
):
    r"""Normalise each token and modulate it: ``y = norm(x) * (1 + scale) + shift``.

    .. math:: y = \left(\frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} \odot w + b\right)
              \odot (1 + \mathrm{scale}) + \mathrm{shift}

    Parameters
    ----------
    x : Tensor
        ``(B, S, D)`` or ``(B, D)``, fp16 / bf16 / fp32, any strides.
    shift, scale : Tensor, optional
        ``(B, D)``, ``(B, 1, D)``, per token ``(B, S, D)`` (Wan 2.2 TI2V) or ``(1, D)`` /
        ``(D,)``, any float dtype, any strides: chunks of a temb (Wan's
        ``(table + temb.float()).chunk(6, 1)``, FLUX's ``emb.chunk(6, dim=1)``) are read in
        place. ``None`` skips that step.
    norm : {"layer", "rms", None}
        LayerNorm (Wan's ``FP32LayerNorm``, FLUX's ``LayerNorm(elementwise_affine=False)``),
        RMSNorm, or none (modulate only).
    weight, bias : Tensor, optional
        The norm's affine parameters, ``(D,)``.
    rounding : {"once", "per_op"}
        ``"once"`` (default): fp32 math, one rounding to x's dtype at the store — Wan's
        arithmetic, which computes the chain in fp32. ``"per_op"``: every step rounded to
        x's dtype as a half-precision eager chain does (FLUX's ``AdaLayerNormZero`` on bf16
        activations and a bf16 temb); shift/scale must then be in x's dtype.
    out : Tensor, optional
        Where to write ``y`` (x's shape and dtype).
    quantize : {None, "fp8"}
        ``"fp8"``: return ``y`` as an FP8 linear's input instead, a
        :class:`~ditfuse.ops.linear_fp8.Rows8` (``q``: e4m3 in x's shape, ``scale``: fp32,
        one a token), bitwise ``quantize_rows`` of the 16-bit ``y``, which is never written
        (16-bit x; rows of up to 8192 channels in one pass).

    Notes
    -----
    Contract: no fused multiply-add, so every step rounds as eager PyTorch does; the
    statistics' reduction order differs from PyTorch's, so the result is within one
    rounding of the eager code (bitwise for most elements: ``ditfuse check``). Inference
    only: no backward; a call on tensors that require grad with grad mode on raises.

    Examples
    --------
    >>> with torch.no_grad():
    ...     shift, scale, gate, c_shift, c_scale, c_gate = (table + temb.float()).chunk(6, 1)
    ...     y = ditfuse.adaln_modulate(x, shift, scale, norm="layer", eps=1e-6)
    """
    _no_grad_check(x, shift, scale, weight, bias)
    _check_quantize(quantize, out=out)
    o = AdaLNOptions(norm, weight, bias, eps, rounding)
    if quantize is not None:
        if torch.compiler.is_compiling():
            q, qs = torch.ops.ditfuse.adaln_fp8(x, None, None, shift, scale, *_op_tail(o))
            return Rows8(q, qs, x.dtype)
        return _run_fp8(x, None, None, shift, scale, o)[1]
    if torch.compiler.is_compiling():
        return torch.ops.ditfuse.adaln(x, None, None, shift, scale, *_op_tail(o))[0]
    return _run(x, None, None, shift, scale, o, out=out)[1]


def gated_residual_adaln(
    x,
    y,
    gate=None,
    shift=None,
    scale=None,
    *,
    norm=DEFAULTS.norm,
    weight=None,
    bias=None,
    eps=DEFAULTS.eps,
    rounding=DEFAULTS.rounding,
    inplace=False,
    quantize=None,
):
    r"""The gated residual and the next norm + modulation, in one pass.

    .. math:: x' = x + y \odot \mathrm{gate}, \qquad
              m = \mathrm{norm}(x') \odot (1 + \mathrm{scale}) + \mathrm{shift}

    ``x'`` is computed in fp32 and stored in x's dtype (as Wan does); ``m`` is computed
    from the stored (rounded) ``x'``, as the model's next norm sees it. ``gate=None`` is a
    plain residual ``x + y``; ``shift=scale=None`` gives the norm without modulation
    (Wan's affine ``norm2`` before cross-attention, with ``weight``/``bias``).

    Parameters
    ----------
    x : Tensor
        The residual stream ``(B, S, D)`` / ``(B, D)``.
    y : Tensor
        The branch output (attention or FFN), x's shape, any float dtype.
    gate, shift, scale : Tensor, optional
        As ``shift`` in :func:`adaln_modulate`.
    inplace : bool
        Write ``x'`` into ``x``.
    norm, weight, bias, eps, rounding, quantize
        As in :func:`adaln_modulate` (``quantize="fp8"``: ``modulated`` is a
        :class:`~ditfuse.ops.linear_fp8.Rows8`; not with ``inplace``).

    Returns
    -------
    (x_new, modulated) : tuple of Tensor

    Notes
    -----
    Contract: ``x_new`` bitwise the eager chain's, ``modulated`` as in
    :func:`adaln_modulate`. Inference only (no backward).

    Examples
    --------
    >>> with torch.no_grad():  # a branch's gated residual, then the next norm + modulation
    ...     x, h = ditfuse.gated_residual_adaln(x, branch_out, gate, shift, scale, eps=1e-6)
    """
    if y is None:
        raise ValueError("y (the branch output) is required; use adaln_modulate without it")
    _no_grad_check(x, y, gate, shift, scale, weight, bias)
    _check_quantize(quantize, inplace=inplace)
    o = AdaLNOptions(norm, weight, bias, eps, rounding)
    if quantize is not None:
        if torch.compiler.is_compiling():
            xn, q, qs = torch.ops.ditfuse.adaln_fp8(x, y, gate, shift, scale, *_op_tail(o))
            return xn, Rows8(q, qs, x.dtype)
        return _run_fp8(x, y, gate, shift, scale, o)
    if torch.compiler.is_compiling():
        args = (x, y, gate, shift, scale, *_op_tail(o))
        if inplace:
            return x, torch.ops.ditfuse.gated_residual_adaln_(*args)
        xn, m = torch.ops.ditfuse.adaln(*args)
        return xn, m
    return _run(x, y, gate, shift, scale, o, inplace=inplace)


def gated_residual(x, y, gate=None, *, rounding=DEFAULTS.rounding, out=None):
    r"""The gated residual alone: ``x_new = x + y * gate``, stored in x's dtype.

    .. math:: x' = \mathrm{round}(x + y \odot \mathrm{gate})

    Wan's FFN residual ``(x.float() + ff.float() * c_gate).type_as(x)`` in one pass (eager
    PyTorch makes five: two fp32 copies, a multiply, an add and a cast). No norm follows:
    the result feeds the next block.

    Parameters
    ----------
    x : Tensor
        The residual stream ``(B, S, D)`` / ``(B, D)``, fp16 / bf16 / fp32, any strides.
    y : Tensor
        The branch output, x's shape, any float dtype.
    gate : Tensor, optional
        As ``shift`` in :func:`adaln_modulate` (per batch entry or per token, any strides);
        ``None`` is a plain residual ``x + y``.
    rounding : {"once", "per_op"}
        ``"once"``: fp32 math, one rounding (Wan). ``"per_op"``: ``y * gate`` rounded to
        x's dtype first, as a half-precision eager chain (FLUX's ``x + gate * ff``).
    out : Tensor, optional
        Where to write ``x_new`` (x's shape and dtype); ``out=x`` updates x in place.

    Notes
    -----
    Contract: bitwise equal to the eager chain (no reduction, no fused multiply-add).
    Inference only (no backward). x, y and the output with dense (S, D) rows (any batch
    stride) run one flat elementwise kernel a batch entry (at the copy ceiling, level with
    torch.compile's kernel: docs/design/adaln.md); other layouts the row-tile kernel, with
    the same bits.

    Examples
    --------
    >>> with torch.no_grad():  # Wan's FFN residual, in place
    ...     ditfuse.gated_residual(x, ffn_out, c_gate, out=x)
    """
    if y is None:
        raise ValueError("y (the branch output) is required")
    _no_grad_check(x, y, gate)
    if torch.compiler.is_compiling():
        return torch.ops.ditfuse.gated_residual(x, y, gate, rounding == "per_op")
    return _run(x, y, gate, None, None, _residual_options(rounding), out=out, modulated=False)[0]


# ---------------------------------------------------------------------------------------
# torch.library ops (used under torch.compile; eager calls launch directly)

_NORM_NAMES = {v: k for k, v in NORMS.items()}


def _rounding(per_op: bool) -> str:
    return "per_op" if per_op else "once"


def _op_options(
    x: torch.Tensor,
    y: Optional[torch.Tensor],
    gate: Optional[torch.Tensor],
    shift: Optional[torch.Tensor],
    scale: Optional[torch.Tensor],
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    norm: int,
    eps: float,
    per_op: bool,
):
    """The schema of the ``ditfuse::adaln`` and ``ditfuse::gated_residual_adaln_`` ops (its
    annotations): their arguments as :func:`_run`'s / :func:`_plan`'s, the tensors x, y,
    gate, shift, scale and the :class:`AdaLNOptions` (:func:`_op_tail`'s inverse)."""
    return (
        x,
        y,
        gate,
        shift,
        scale,
        AdaLNOptions(_NORM_NAMES[norm], weight, bias, eps, _rounding(per_op)),
    )


def _op_tail(o: AdaLNOptions) -> tuple:
    """The options ``o`` as the ops' arguments after the tensors (weight, bias, norm, eps,
    per_op)."""
    return o.weight, o.bias, NORMS[o.norm], float(o.eps), o.rounding == "per_op"


def _adaln_op(name: str, returns, mutates_args=(), y=Optional[torch.Tensor]):
    """``@_adaln_op(name, returns, ...)`` on ``fn(x, y, gate, shift, scale, o)``:
    the op ``ditfuse::<name>`` with the schema of :func:`_op_options` (``y`` of type
    ``y``); its ``.register_fake`` takes a fake of the same form."""
    sig = inspect.signature(_op_options, eval_str=True)
    params = [q.replace(annotation=y) if q.name == "y" else q for q in sig.parameters.values()]
    signature = sig.replace(parameters=params, return_annotation=returns)

    def flat(fn):
        def impl(*args):
            return fn(*_op_options(*args))

        impl.__signature__ = signature
        impl.__name__, impl.__doc__ = fn.__name__, fn.__doc__
        return impl

    def wrap(fn):
        registered = library.op(f"ditfuse::{name}", mutates_args=mutates_args)(flat(fn))
        register_fake = registered.register_fake
        registered.register_fake = lambda fake: register_fake(flat(fake))
        return registered

    return wrap


@_adaln_op("adaln", list[torch.Tensor])
def _modulate_op(x, y, gate, shift, scale, o):
    """[modulated] or, with y, [x_new, modulated]."""
    xn, m = _run(x, y, gate, shift, scale, o)
    return [m] if xn is None else [xn, m]


@_modulate_op.register_fake
def _(x, y, gate, shift, scale, o):
    _plan(x, y, gate, shift, scale, o)
    o = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return [o] if y is None else [torch.empty_like(o), o]


@_adaln_op("adaln_fp8", list[torch.Tensor])
def _modulate_fp8_op(x, y, gate, shift, scale, o):
    """[q, scale] or, with y, [x_new, q, scale]: the modulated output in e4m3 a token."""
    xn, r = _run_fp8(x, y, gate, shift, scale, o)
    return [r.q, r.scale] if xn is None else [xn, r.q, r.scale]


@_modulate_fp8_op.register_fake
def _(x, y, gate, shift, scale, o):
    _plan(x, y, gate, shift, scale, o)
    q = torch.empty(x.shape, dtype=FP8, device=x.device)
    qs = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    return [q, qs] if y is None else [torch.empty_like(x), q, qs]


@_adaln_op("gated_residual_adaln_", torch.Tensor, mutates_args=("x",), y=torch.Tensor)
def _gated_inplace_op(x, y, gate, shift, scale, o):
    """x_new written into x; returns the modulated output."""
    return _run(x, y, gate, shift, scale, o, inplace=True)[1]


@_gated_inplace_op.register_fake
def _(x, y, gate, shift, scale, o):
    _plan(x, y, gate, shift, scale, o)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@library.op("ditfuse::gated_residual", mutates_args=())
def _gated_residual_op(
    x: torch.Tensor, y: torch.Tensor, gate: Optional[torch.Tensor], per_op: bool
) -> torch.Tensor:
    return _run(x, y, gate, None, None, _residual_options(_rounding(per_op)), modulated=False)[0]


@_gated_residual_op.register_fake
def _(x, y, gate, per_op):
    _plan(x, y, gate, None, None, _residual_options(_rounding(per_op)))
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)
