"""Fused GroupNorm + SiLU for the VAEs' ResNet blocks, and Wan's channel RMS norm + SiLU.

Layout, as in ``ditfuse.ops.qk_norm_rope``: the Triton kernels (``_gn_fit_kernel``,
``_gn_stats_kernel`` + ``_gn_apply_kernel``, the channels-last ``_gn_cl_*`` kernels,
``_rms_ch_kernel``) are in :mod:`ditfuse.kernels.group_norm`; this module holds the small
analytical launch tables (``GN_TABLE`` read by ``gn_settings``, ``RMS_TABLE`` by
``rms_settings``), the launchers that validate ->
allocate -> launch, the public functions :func:`group_norm_silu` and
:func:`rms_norm_silu_channels`, and at its end their ``torch.library`` ops
(``ditfuse::group_norm_silu``, ``ditfuse::rms_norm_silu_channels``, with fake
implementations); eager calls launch directly, only code being compiled goes through the
ops. The pure-PyTorch references (the fp64 test oracle and the fallback for devices Triton
cannot run on) are in :mod:`ditfuse.reference`; the numerical contract's tolerances in
:mod:`ditfuse.tools.gn_contract`. Inference only. Measurements behind the table:
docs/design/group_norm.md.

Input is channels-first ``(N, C, *spatial)`` of rank >= 3, addressed as ``(N, C, S)`` with
one stride per axis, so any view whose spatial dimensions collapse into one stride is read
in place: a channel or batch slice of a bigger tensor, a channels-last(-3d) tensor, a time
slice of a video. Views whose spatial dimensions cannot be addressed with one stride (a
spatial crop) raise ``ValueError`` naming ``x``; there is never a hidden ``.contiguous()``.

Bytes model (the floor the kernels are measured against): GroupNorm reads ``x`` once and
writes ``y`` once when one program holds a whole group in registers (the *fit* path), and
reads ``x`` twice when a group is too large for that (the *split* path: a statistics pass,
then an apply pass); the per-group partial statistics it exchanges are a few KB. The RMS
norm over channels reads ``x`` once (a column of ``C`` channels is held on chip).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
import triton

from ditfuse.kernels.group_norm import (
    FinishFlags,
    _gn_apply_kernel,
    _gn_cl_apply_kernel,
    _gn_cl_stats_kernel,
    _gn_fit_kernel,
    _gn_merge_kernel,
    _gn_stats_kernel,
    _rms_ch_kernel,
)
from ditfuse.reference import (
    GNOptions,
    RMSOptions,
    group_norm_silu_reference,
    rms_norm_silu_channels_reference,
)
from ditfuse.runtime import backend, fastpath, library

#: the public functions' defaults, written once (the references take them too)
GN_DEFAULTS = GNOptions()
RMS_DEFAULTS = RMSOptions()
ACT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

#: offsets inside a split-path tile (or a channel-RMS column block) are int32 below this;
#: the tile's corner is int64
OFF32_LIMIT = 2**31


# ---------------------------------------------------------------------------------------
# launch settings: analytical tables, no autotuning (the kernels are memory-bound); the
# measurements behind every entry are in docs/design/group_norm.md


@dataclass(frozen=True, eq=False)
class GNTable:
    """The table :func:`gn_settings` derives a GroupNorm launch from.

    Compared by identity: a call's replay key holds the table it was launched under.
    """

    #: padded elements (next_pow2(C/G) * next_pow2(spatial)) of a group one program holds
    #: in registers (16 warps x 32 fp32 values a thread); larger groups take the split path
    fit_max: int = 16384
    #: elements of one split-path tile (8 warps x 32 values a thread): twice the bytes in
    #: flight a program of 4096 or 2048, faster at every split-path shape
    tile: int = 8192
    #: channels-first statistics programs in total (about 8 an SM of a 132-SM GPU), spread
    #: over the N * G groups ...
    stats_programs: int = 1024
    #: ... but at most this many a group: every apply program merges its group's partials
    max_partials: int = 128
    #: channels-first: a statistics program's tile count rounded up to a power of two
    #: (fewer programs, fewer kernel variants)
    tpp_pow2: bool = True
    #: channels-last statistics programs in total: fewer, longer programs than
    #: channels-first, since each ends by merging its element slots' running moments (five
    #: cross-thread group sums a program)
    cl_stats_programs: int = 256
    #: channels-last: a statistics program's tile count as it comes (not rounded)
    cl_tpp_pow2: bool = False
    #: channel lanes a channels-last tile spans at most (several groups side by side:
    #: 128-byte rows of bf16) ...
    cl_lanes: int = 64
    #: ... for groups of at most this many channels (larger ones keep one-group tiles)
    cl_cpp_max: int = 1024
    #: a statistics program summing at most this many tiles runs 4 warps (else 8)
    stats_few_tiles: int = 4
    #: elements a thread of the apply pass holds (sets num_warps): more independent loads
    #: a thread in flight
    apply_per_thread: int = 64


@dataclass(frozen=True, eq=False)
class RMSTable:
    """The table :func:`rms_settings` derives a channel-RMS launch from (compared by
    identity, as :class:`GNTable`)."""

    #: channel elements x positions one program holds
    tile: int = 8192
    #: positions a program at least (32-byte rows of bf16: a sector)
    min_bs: int = 16
    #: registers a thread of the unmasked in-register 16-bit column may hold (ptxas
    #: .maxnreg): 6 programs of 4 warps an SM instead of 5, the same bits; at most 16
    #: bytes of local memory, outside any loop (the kernel has none)
    maxnreg: int = 80
    #: elements a thread of the in-register column holds (sets num_warps)
    per_thread: int = 64


GN_TABLE = GNTable()
RMS_TABLE = RMSTable()


def _warps(elems: int, per_thread: int, lo: int = 1, hi: int = 16) -> int:
    w = elems / (32 * per_thread)
    return min(hi, max(lo, 1 << max(0, round(math.log2(max(w, 1e-9))))))


@dataclass(frozen=True)
class GNSettings:
    """How one GroupNorm call is launched.

    ``path`` "fit": one program per (n, group), tile BC x BS covering the group.
    ``path`` "split": groups tiled BC x BS (``T`` tiles a group, ``n_ts`` along space);
    ``P`` statistics programs a group of ``TPP`` tiles each, then one apply program a tile.
    ``path`` "split-cl" (channels-last x): tiles of ``GB`` groups' ``BC = GB * CPP`` channel
    lanes x ``BS`` positions; ``P`` statistics programs a group block of ``TPP`` tiles each,
    a merge program a group, then one apply program a tile (``T = n_ts`` a group block).
    """

    path: str
    BC: int
    BS: int
    num_warps: int
    n_ts: int = 1
    T: int = 1
    P: int = 1
    TPP: int = 1
    P_PAD: int = 1
    stats_warps: int = 1
    GB: int = 1  # "split-cl": groups a tile spans (BC is then its GB * CPP channel lanes)
    CPP: int = 1  # "split-cl": lanes a group takes, next_pow2(C / G)


def _stats_split(tiles: int, units: int, cap: int, total: int, pow2: bool) -> Tuple[int, int]:
    """(tiles a statistics program, programs a unit) for ``units`` runs of ``tiles`` tiles
    (groups, or channels-last group blocks) sharing about ``total`` programs, at most
    ``cap`` a unit; the tile count rounded up to a power of two if ``pow2``."""
    per = triton.cdiv(tiles, max(1, min(tiles, cap, triton.cdiv(total, units))))
    per = triton.next_power_of_2(max(per, 1)) if pow2 else per  # per = 0: no tiles (S = 0)
    return per, triton.cdiv(tiles, per)


def _two_pass(
    t: GNTable, path: str, tile, n_ts: int, T: int, stats, stats_warps: int, **cl
) -> GNSettings:
    """The settings of a two-pass path ("split", "split-cl"): ``tile`` = (BC, BS) applied
    ``t.apply_per_thread`` elements a thread, ``n_ts`` position tiles, T tiles a unit,
    ``stats`` = (TPP, P) from :func:`_stats_split`; ``cl``: the "split-cl" fields."""
    (BC, BS), (TPP, P) = tile, stats
    return GNSettings(
        path=path,
        BC=BC,
        BS=BS,
        num_warps=_warps(BC * BS, t.apply_per_thread, hi=8),
        n_ts=n_ts,
        T=T,
        P=P,
        TPP=TPP,
        P_PAD=triton.next_power_of_2(max(P, 1)),
        stats_warps=stats_warps,
        **cl,
    )


def gn_settings(
    N: int, G: int, cpg: int, S: int, *, c_inner: bool = False, **overrides
) -> GNSettings:
    """Launch settings for GroupNorm of N x G groups of ``cpg`` channels x ``S`` positions,
    from ``GN_TABLE`` (``overrides``: fields of :class:`GNTable` replaced, for tests and
    sweeps).

    A group whose padded tile has at most ``fit_max`` elements is read once (fit path);
    otherwise twice (split path). The split path gives each group
    ``min(T, max_partials, cdiv(stats_programs, N * G))`` statistics programs (rounded so
    that each takes a power-of-two number of tiles if ``tpp_pow2``). A split tile spans the
    positions (contiguous in NCHW), or the group's channels first when they are the
    unit-stride axis (``c_inner``: channels-last), so that its rows are whole sectors of
    memory. Channels-last groups of at most ``cl_cpp_max`` channels take the "split-cl"
    path instead: tiles of several groups' channels (up to ``cl_lanes`` lanes) x
    positions, all of a tile's rows contiguous, ``cdiv(cl_stats_programs, N * group
    blocks)`` statistics programs a group block (tile counts rounded if ``cl_tpp_pow2``).
    """
    t = dataclasses.replace(GN_TABLE, **overrides) if overrides else GN_TABLE
    cp, sp = triton.next_power_of_2(max(cpg, 1)), triton.next_power_of_2(max(S, 1))
    if cp * sp <= t.fit_max:
        return GNSettings(path="fit", BC=cp, BS=sp, num_warps=_warps(cp * sp, 32))
    if c_inner and cp <= t.cl_cpp_max:
        GB = max(
            1, min(triton.next_power_of_2(G), max(t.cl_lanes, cp) // cp, max(t.tile, cp) // cp)
        )
        L = GB * cp
        BS = min(sp, max(1, t.tile // L))
        n_ts = triton.cdiv(S, BS)
        stats = _stats_split(n_ts, N * triton.cdiv(G, GB), n_ts, t.cl_stats_programs, t.cl_tpp_pow2)
        # the statistics hold a running mean and M2 a slot: 32 slots a thread (8 warps)
        stats_warps = _warps(L * BS, 32, hi=8)
        return _two_pass(t, "split-cl", (L, BS), n_ts, n_ts, stats, stats_warps, GB=GB, CPP=cp)
    if c_inner:
        BC = min(cp, t.tile)
        BS = min(sp, max(1, t.tile // BC))
    else:
        BS = min(sp, t.tile)
        BC = min(cp, max(1, t.tile // BS))
    n_ts = triton.cdiv(S, BS)
    T = triton.cdiv(cpg, BC) * n_ts
    TPP, P = _stats_split(T, N * G, t.max_partials, t.stats_programs, t.tpp_pow2)
    # 4 warps where a program sums few tiles, 8 for longer loops
    stats_warps = _warps(BC * BS, 16, hi=8 if TPP > t.stats_few_tiles else 4)
    return _two_pass(t, "split", (BC, BS), n_ts, T, (TPP, P), stats_warps)


@dataclass(frozen=True)
class RMSSettings:
    BC: int
    BS: int
    NCH: int
    num_warps: int
    BC1: int = 0  # NCH == 1: the column's second power-of-two piece (0: one piece)
    maxnreg: int = 0  # registers a thread at most (ptxas .maxnreg) for unmasked launches; 0: none


def rms_settings(C: int, S: int, *, itemsize: int = 2, **overrides) -> RMSSettings:
    """Launch settings for the channel RMS norm, from ``RMS_TABLE`` (``overrides``: fields
    of :class:`RMSTable` replaced): a program takes BS positions and all C channels, in
    ``NCH`` chunks of BC when the column does not fit ``tile`` elements. ``itemsize``: x's
    element size; 16-bit columns held in registers take the register cap ``maxnreg``
    (applied to unmasked launches only)."""
    t = dataclasses.replace(RMS_TABLE, **overrides) if overrides else RMS_TABLE
    cp = triton.next_power_of_2(max(C, 1))
    BS = min(
        triton.next_power_of_2(max(S, 1)),
        max(t.min_bs, triton.next_power_of_2(max(1, t.tile // cp))),
    )
    if cp * BS <= t.tile:
        # the column as two power-of-two pieces: 96 = 64 + 32, 384 = 256 + 128
        BC = cp // 2 if C <= cp // 2 + cp // 4 and cp >= 4 else cp
        return RMSSettings(
            BC=BC,
            BS=BS,
            NCH=1,
            num_warps=_warps(cp * BS, t.per_thread),
            BC1=triton.next_power_of_2(C - BC) if C > BC else 0,
            maxnreg=t.maxnreg if itemsize == 2 else 0,
        )
    BC = max(1, t.tile // BS)
    return RMSSettings(BC=BC, BS=BS, NCH=triton.cdiv(C, BC), num_warps=_warps(BC * BS, 32))


# ---------------------------------------------------------------------------------------
# validation -> a plan (views and numbers only; nothing is copied or launched)


@dataclass
class Plan:
    x: torch.Tensor
    N: int
    C: int
    S: int
    xs: Tuple[int, int, int]  # x's (n, c, s) element strides
    weight: Optional[torch.Tensor]
    w_stride: int
    bias: Optional[torch.Tensor]
    b_stride: int
    eps: float
    silu: bool
    round_after_norm: bool
    groups: int = 1  # GroupNorm only
    scale: float = 1.0  # channel RMS only


def _ncs(t: torch.Tensor, name: str) -> Tuple[int, int, int, Tuple[int, int, int]]:
    """(N, C, S, (stride_n, stride_c, stride_s)) of a (N, C, *spatial) view, or ValueError."""
    shape, strides = tuple(t.shape), tuple(t.stride())
    N, C = shape[0], shape[1]
    dims = [(d, st) for d, st in zip(shape[2:], strides[2:]) if d != 1]
    S = 1
    for d, _ in dims:
        S *= d
    ss = dims[-1][1] if dims else 1
    for (d0, s0), (d1, s1) in zip(dims, dims[1:]):
        if s0 != s1 * d1:
            raise ValueError(
                f"{name} of shape {shape} has strides {strides}: its spatial dimensions "
                f"{shape[2:]} cannot be addressed with one stride (a spatial crop or "
                f"transposed spatial axes); ditfuse makes no hidden copy: pass "
                f"{name}.contiguous() (channel/batch slices and channels-last tensors are "
                f"read in place)"
            )
    return N, C, S, (strides[0], strides[1], ss)


def _check_x(x, name="x") -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in ACT_DTYPES:
        raise TypeError(f"{name}.dtype must be float16, bfloat16 or float32, got {x.dtype}")
    if x.dim() < 3:
        raise ValueError(
            f"{name} must be channels-first (N, C, *spatial) with at least one "
            f"spatial dimension, e.g. (N, C, H, W) or (N, C, T, H, W); got shape "
            f"{tuple(x.shape)}"
        )


def _channel_param(p, name: str, C: int, x: torch.Tensor):
    """(tensor, element stride along its channel axis) of a per-channel parameter.

    Any shape with C elements along one axis and 1 elsewhere: (C,), (C, 1, 1), (C, 1, 1, 1).
    """
    if p is None:
        return None, 0
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(p).__name__}")
    if p.dtype not in ACT_DTYPES:
        raise TypeError(f"{name}.dtype must be float16, bfloat16 or float32, got {p.dtype}")
    shape = tuple(p.shape)
    big = [i for i, d in enumerate(shape) if d != 1]
    if p.numel() != C or len(big) > 1:
        raise ValueError(
            f"{name} has shape {shape}; expected {C} elements along one axis: "
            f"({C},), ({C}, 1, 1) or ({C}, 1, 1, 1) for x with C = {C} channels"
        )
    if p.device != x.device:
        raise ValueError(f"{name} is on {p.device}, x is on {x.device}")
    return p, (p.stride(big[0]) if big else 1)


def _check_eps(eps, name="eps") -> float:
    if (
        isinstance(eps, bool)
        or not isinstance(eps, (int, float))
        or not eps >= 0
        or not math.isfinite(eps)
    ):
        raise ValueError(f"{name} must be a finite float >= 0, got {eps!r}")
    return float(eps)


def _check_flag(v, name) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{name} must be a bool, got {type(v).__name__}")
    return v


def plan_group_norm(
    x, num_groups, weight=None, bias=None, eps=1e-6, *, silu=True, round_after_norm=True
) -> Plan:
    """Check every argument of :func:`group_norm_silu`; raises before anything runs."""
    _check_x(x)
    N, C, S, xs = _ncs(x, "x")
    if (
        isinstance(num_groups, bool)
        or not isinstance(num_groups, int)
        or num_groups <= 0
        or C % num_groups
    ):
        raise ValueError(
            f"num_groups={num_groups!r} must be a positive int dividing the "
            f"channels C = {C} (x shape {tuple(x.shape)})"
        )
    w, ws = _channel_param(weight, "weight", C, x)
    b, bs = _channel_param(bias, "bias", C, x)
    return Plan(
        x,
        N,
        C,
        S,
        xs,
        w,
        ws,
        b,
        bs,
        _check_eps(eps),
        _check_flag(silu, "silu"),
        _check_flag(round_after_norm, "round_after_norm"),
        groups=num_groups,
    )


def plan_rms_channels(
    x, gamma=None, bias=None, eps=1e-12, *, scale=None, silu=True, round_after_norm=True
) -> Plan:
    """Check every argument of :func:`rms_norm_silu_channels`; raises before anything runs."""
    _check_x(x)
    N, C, S, xs = _ncs(x, "x")
    g, gs = _channel_param(gamma, "gamma", C, x)
    if isinstance(bias, (int, float)) and not isinstance(bias, bool) and bias == 0:
        bias = None  # diffusers' WanRMS_norm(bias=False) holds bias = 0.0
    b, bs = _channel_param(bias, "bias", C, x)
    if scale is None:
        scale = math.sqrt(C) if isinstance(C, int) else C**0.5  # symbolic C when tracing
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"scale must be a finite float (default sqrt(C)), got {scale!r}")
    else:
        scale = float(scale)
    return Plan(
        x,
        N,
        C,
        S,
        xs,
        g,
        gs,
        b,
        bs,
        _check_eps(eps),
        _check_flag(silu, "silu"),
        _check_flag(round_after_norm, "round_after_norm"),
        scale=scale,
    )


def _check_out(out, x: torch.Tensor, runtime_checks: bool = True):
    """out's (n, c, s) strides; ``out`` may be ``x`` itself (in place) but no other alias."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
    if out.dtype != x.dtype:
        raise TypeError(f"out.dtype {out.dtype} must equal x.dtype {x.dtype}")
    if tuple(out.shape) != tuple(x.shape):
        raise ValueError(f"out.shape {tuple(out.shape)} must equal x.shape {tuple(x.shape)}")
    if out.device != x.device:
        raise ValueError(f"out is on {out.device}, x is on {x.device}")
    _, _, _, os_ = _ncs(out, "out")
    if runtime_checks and out.numel():
        if torch._debug_has_internal_overlap(out) == 1 or any(
            st == 0 and d > 1 for d, st in zip(out.shape, out.stride())
        ):
            raise ValueError(
                "out has overlapping elements (an expanded view?); pass a tensor "
                "whose elements are distinct memory"
            )
        same_view = out.data_ptr() == x.data_ptr() and out.stride() == x.stride()
        if not same_view and out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():

            def span(t):
                lo = t.data_ptr()
                return lo, lo + (
                    sum((d - 1) * s for d, s in zip(t.shape, t.stride())) + 1
                ) * t.element_size()

            (a0, a1), (b0, b1) = span(out), span(x)
            if a0 < b1 and b0 < a1:
                raise ValueError(
                    "out overlaps x's memory without being x itself; pass out=x "
                    "to normalise in place, or memory disjoint from x"
                )
    return os_


def _check_grad(*ts):
    if torch.is_grad_enabled():
        for t in ts:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                raise RuntimeError(
                    "ditfuse's group_norm_silu / rms_norm_silu_channels are "
                    "inference-only (no backward): call them under "
                    "torch.no_grad() or torch.inference_mode()"
                )


# ---------------------------------------------------------------------------------------
# allocate -> launch


def _out_like(x: torch.Tensor) -> torch.Tensor:
    """The output of a call without ``out=``: x's strides when x is dense, else contiguous."""
    return torch.empty_like(x, memory_format=torch.preserve_format)


def _partials(n: int, device) -> torch.Tensor:
    """fp32 scratch for the split path's partial statistics (every slot is written)."""
    return torch.empty(4 * n, dtype=torch.float32, device=device)


def _scratch(st: GNSettings, NG: int, device) -> tuple:
    """The scratch tensors a launch of settings ``st`` for ``NG`` groups takes."""
    if st.path == "split":
        return (_partials(NG * st.P, device),)
    if st.path == "split-cl":  # partials, then each group's merged statistics
        return (_partials(NG * st.P, device), _partials(NG, device))
    return ()


def _tile_span(st: GNSettings, strides) -> int:
    """The largest element offset inside one split-path tile, for (n, c, s) ``strides`` (an
    upper bound for "split-cl" tiles, whose BC lanes may pad a group)."""
    return (st.BC - 1) * abs(strides[1]) + (st.BS - 1) * abs(strides[2])


def launch_group_norm(
    p: Plan, out: torch.Tensor, os_, settings: Optional[GNSettings] = None, **overrides
) -> Tuple[GNSettings, tuple]:
    """Run GroupNorm (+ SiLU) for plan ``p`` into ``out`` (strides ``os_``); returns the
    settings and the scratch tensors the launches took. ``overrides``: as for
    :func:`gn_settings`."""
    N, C, S, G = p.N, p.C, p.S, p.groups
    cpg = C // G
    c_inner = p.xs[1] == 1 and p.xs[2] != 1 and S > 1
    st = settings or gn_settings(N, G, cpg, S, c_inner=c_inner, **overrides)
    if N * C * S == 0:
        return st, ()
    w, b = _affine(p)
    io = _io(p, os_)
    launch = fastpath.launch
    if st.path == "fit":
        launch(
            _gn_fit_kernel,
            (N * G,),
            (p.x, out, w, b, G, cpg, S, float(cpg * S), p.eps),
            dict(io, BC=st.BC, BS=st.BS, num_warps=st.num_warps),
        )
        return st, ()
    NG = N * G
    scratch = _scratch(st, NG, p.x.device)
    if st.path == "split-cl":
        _launch_cl(p, out, st, scratch, io)
        return st, scratch
    (part,) = scratch
    ngp = NG * st.P
    off64 = max(_tile_span(st, p.xs), _tile_span(st, os_)) >= OFF32_LIMIT
    even = cpg % st.BC == 0 and S % st.BS == 0
    launch(
        _gn_stats_kernel,
        (ngp,),
        (p.x, part, G, cpg, S, st.n_ts, st.T, st.P, ngp),
        dict(
            x_strides=p.xs,
            BC=st.BC,
            BS=st.BS,
            TPP=st.TPP,
            OFF64=off64,
            EVEN=even and st.P * st.TPP == st.T,
            num_warps=st.stats_warps,
        ),
    )
    launch(
        _gn_apply_kernel,
        (NG * st.T,),
        (p.x, out, w, b, part, G, cpg, S, st.n_ts, st.T, st.P, ngp, p.eps),
        dict(
            io, BC=st.BC, BS=st.BS, P_PAD=st.P_PAD, OFF64=off64, EVEN=even, num_warps=st.num_warps
        ),
    )
    return st, scratch


def _affine(p: Plan):
    """The (weight, bias) tensors a launch takes: x where absent (not read)."""
    return tuple(t if t is not None else p.x for t in (p.weight, p.bias))


def _io(p: Plan, os_) -> dict:
    """The keyword arguments every normalising kernel takes: the strides of x, y (``os_``)
    and the affine, and the steps after the norm (``FinishFlags``)."""
    return dict(
        x_strides=p.xs,
        y_strides=os_,
        wb_strides=(p.w_stride, p.b_stride),
        FIN=FinishFlags(p.weight is not None, p.bias is not None, p.silu, p.round_after_norm),
    )


def _launch_cl(p: Plan, out, st: GNSettings, scratch, io: dict) -> None:
    """The channels-last split path: statistics, merge, apply (``io``: :func:`_io`)."""
    N, S, G = p.N, p.S, p.groups
    cpg = p.C // G
    part, stat = scratch
    NG = N * G
    ngp = NG * st.P
    n_gb = triton.cdiv(G, st.GB)

    off64 = max(_tile_span(st, p.xs), _tile_span(st, io["y_strides"])) >= OFF32_LIMIT
    pow2 = cpg == st.CPP
    even = pow2 and G % st.GB == 0 and S % st.BS == 0
    w, b = _affine(p)
    launch = fastpath.launch
    launch(
        _gn_cl_stats_kernel,
        (N * st.P * n_gb,),
        (p.x, part, G, cpg, S, n_gb, st.n_ts, st.P, ngp),
        dict(
            x_strides=p.xs,
            GB=st.GB,
            CPP=st.CPP,
            BS=st.BS,
            TPP=st.TPP,
            POW2=pow2,
            OFF64=off64,
            EVEN=even and st.P * st.TPP == st.n_ts,
            num_warps=st.stats_warps,
        ),
    )
    launch(
        _gn_merge_kernel,
        (NG,),
        (part, stat, st.P, ngp, NG, p.eps),
        dict(P_PAD=st.P_PAD, num_warps=4 if st.P_PAD > 128 else 1),
    )
    launch(
        _gn_cl_apply_kernel,
        (N * st.n_ts * n_gb,),
        (p.x, out, w, b, stat, G, cpg, S, n_gb, NG),
        dict(
            io,
            GB=st.GB,
            CPP=st.CPP,
            BS=st.BS,
            POW2=pow2,
            OFF64=off64,
            EVEN=even,
            num_warps=st.num_warps,
        ),
    )


def _col_span(st: RMSSettings, strides) -> int:
    """The largest element offset inside one channel-RMS column block (NCH == 1)."""
    return (st.BC + st.BC1 - 1) * abs(strides[1]) + (st.BS - 1) * abs(strides[2])


def launch_rms_channels(
    p: Plan, out: torch.Tensor, os_, settings: Optional[RMSSettings] = None, **overrides
) -> RMSSettings:
    """Run the channel RMS norm (+ SiLU) for plan ``p`` into ``out`` (strides ``os_``).
    ``overrides``: as for :func:`rms_settings`."""
    N, C, S = p.N, p.C, p.S
    st = settings or rms_settings(C, S, itemsize=p.x.element_size(), **overrides)
    if N * C * S == 0:
        return st
    n_sb = triton.cdiv(S, st.BS)
    even = st.NCH == 1 and st.BC + st.BC1 == C and S % st.BS == 0
    # the cap only where it was measured and built: masked columns need far more registers
    # (the cap would spill them by kilobytes)
    cap = {"maxnreg": st.maxnreg} if st.maxnreg and even else {}
    fastpath.launch(
        _rms_ch_kernel,
        (N * n_sb,),
        (p.x, out, *_affine(p), C, S, n_sb, p.eps, p.scale),
        dict(
            _io(p, os_),
            BC=st.BC,
            BC1=st.BC1,
            BS=st.BS,
            NCH=st.NCH,
            OFF64=max(_col_span(st, p.xs), _col_span(st, os_)) >= OFF32_LIMIT,
            EVEN=even,
            num_warps=st.num_warps,
            **cap,
            # no contraction: with bf16 operands LLVM narrows (t * gamma) rounded, + bias to
            # bf16 ops and fuses them into one fma.rn.bf16, dropping the rounding after * gamma
            # that WanRMS_norm's half-precision chain performs
            enable_fp_fusion=False,
        ),
    )
    return st


_CACHE = fastpath.Cache()


def _key(kind, x, weight, bias, out, opts, launch):
    """The signature a call is recorded / replayed under, or None (not cached: no kernel
    device, an argument the checks will explain, an ``out`` sharing x's memory)."""
    if not fastpath.usable(x):
        return None
    try:
        if out is not None and out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
            return None
        sig = fastpath.sig
        return (
            kind,
            opts,
            None if launch is None else tuple(sorted(launch.items())),
            GN_TABLE,
            RMS_TABLE,
            OFF32_LIMIT,
            sig(x),
            sig(weight),
            sig(bias),
            sig(out),
        )
    except (AttributeError, TypeError):
        return None


def _replayed(key, x, weight, bias, out):
    """A repeat call of a recorded signature (:mod:`ditfuse.runtime.fastpath`): its output,
    or None."""
    hit = _CACHE.get(key)
    if hit is None:
        return None
    replay, st, NG = hit
    o = out if out is not None else _out_like(x)
    scratch = _scratch(st, NG, x.device) if st is not None else ()
    return o if replay((x, weight, bias, o) + scratch) else None


def _run(
    p: Plan, out: Optional[torch.Tensor], rms: bool, launch_kw: Optional[dict] = None, key=None
):
    """Allocate -> launch for a checked plan. ``key``: the call's signature, under which its
    launches are recorded for replay (:mod:`ditfuse.runtime.fastpath`); None: not recorded."""
    if out is None:
        out = _out_like(p.x)
        os_ = _ncs(out, "out")[3]
    else:
        os_ = _check_out(out, p.x)
    if backend.kernel_device_ok(p.x):
        with fastpath.Recorder() as rec:
            if rms:
                launch_rms_channels(p, out, os_, **(launch_kw or {}))
                st, scratch = None, ()
            else:
                st, scratch = launch_group_norm(p, out, os_, **(launch_kw or {}))
        if key is not None and p.N * p.C * p.S:
            replay = rec.replay((p.x, p.weight, p.bias, out) + scratch)
            if replay is not None:
                _CACHE.put(key, (replay, st, p.N * p.groups))
    else:  # a device Triton cannot run on here: the fp32 reference
        flags = dict(silu=p.silu, round_after_norm=p.round_after_norm)
        if rms:
            r = rms_norm_silu_channels_reference(
                p.x, p.weight, p.bias, p.eps, scale=p.scale, **flags
            )
        else:
            r = group_norm_silu_reference(p.x, p.groups, p.weight, p.bias, p.eps, **flags)
        out.copy_(r)
    return out


def _call(rms: bool, x, weight, bias, out, launch, **opts):
    """A replay of the call's signature, else check -> allocate -> launch (recorded).
    ``opts``: the rest of ``plan_group_norm`` / ``plan_rms_channels``'s arguments."""
    if rms and isinstance(bias, (int, float)) and not isinstance(bias, bool) and bias == 0:
        bias = None  # diffusers' WanRMS_norm(bias=False) holds bias = 0.0: cacheable as None
    key = _key("rms" if rms else "gn", x, weight, bias, out, tuple(opts.items()), launch)
    y = _replayed(key, x, weight, bias, out) if key is not None else None
    if y is not None:
        return y
    return _run(_plan(rms, x, weight, bias, **opts), out, rms=rms, launch_kw=launch, key=key)


def _plan(rms: bool, x, weight, bias, **opts) -> Plan:
    """``plan_rms_channels`` (``weight``: gamma) or ``plan_group_norm`` of the arguments."""
    if rms:
        return plan_rms_channels(x, gamma=weight, bias=bias, **opts)
    return plan_group_norm(x, weight=weight, bias=bias, **opts)


# ---------------------------------------------------------------------------------------
# public functions


def _into(out: Optional[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
    """The traced op's result ``y``, copied into ``out`` when one is given."""
    return y if out is None else out.copy_(y)


def group_norm_silu(
    x,
    num_groups,
    weight=None,
    bias=None,
    eps=GN_DEFAULTS.eps,
    *,
    silu=GN_DEFAULTS.silu,
    round_after_norm=GN_DEFAULTS.round_after_norm,
    out=None,
    _launch=None,
):
    r"""GroupNorm then SiLU, in one kernel (two when a group does not fit on chip).

    .. math::

        \hat x = \frac{x - \mu_{n,g}}{\sqrt{\sigma^2_{n,g} + \epsilon}}\,w_c + b_c, \qquad
        y = \hat x \cdot \sigma(\hat x) = \frac{\hat x}{1 + e^{-\hat x}}

    with the mean :math:`\mu` and biased variance :math:`\sigma^2` of each group ``g`` of
    ``C / num_groups`` consecutive channels over all spatial positions of sample ``n``:
    ``torch.nn.GroupNorm(num_groups, C, eps)`` then ``torch.nn.functional.silu``, as the
    ResNet blocks of the AutoencoderKL VAEs (FLUX.1, FLUX.2, HunyuanVideo: 32 groups,
    eps=1e-6, affine) compute it.

    Parameters
    ----------
    x : Tensor
        Channels-first ``(N, C, *spatial)``, rank >= 3: ``(N, C, H, W)``, ``(N, C, T, H, W)``
        ...; fp16, bf16 or fp32. Any strides whose spatial dimensions collapse into one
        (contiguous, channels-last, a channel / batch / time slice of a bigger tensor) are
        read in place; other views (a spatial crop) raise ``ValueError``: no hidden copy.
    num_groups : int
        Divides ``C``.
    weight, bias : Tensor, optional
        Per-channel affine parameters with ``C`` elements (``(C,)``, or ``(C, 1, 1)``-like),
        any float dtype, on ``x``'s device; e.g. ``norm.weight``, ``norm.bias``.
    eps : float
        Added to the variance (VAEs: 1e-6; ``torch.nn.GroupNorm``'s default is 1e-5).
    silu : bool
        ``False``: GroupNorm only (the VAE attention blocks' norm).
    round_after_norm : bool
        ``True`` (default): round the normalised, affine value to ``x.dtype`` before the SiLU,
        where eager ``GroupNorm -> SiLU`` in bf16/fp16 rounds, so a patched VAE computes what
        the unpatched one does (bitwise in bf16). ``False``: one rounding, at the store.
    out : Tensor, optional
        Written and returned: ``x``'s shape, dtype and device, strides as for ``x``; may be
        ``x`` itself (in place), must not otherwise overlap it.

    Returns
    -------
    Tensor
        ``out``, or a new tensor in ``x``'s dtype (``x``'s strides when ``x`` is dense,
        else contiguous).

    Notes
    -----
    Numerical contract: statistics and arithmetic in fp32; the statistics are two-pass
    (mean, then squared deviations from it, with the corrected-two-pass mean correction):
    over registers when a group of at most ``GN_TABLE.fit_max`` padded elements fits one
    program, else per tile of data shifted by the group's first element, merged with Chan's
    parallel formula (``gn_settings`` picks the path). Neither forms E[x^2] - E[x]^2, so a
    large offset costs no accuracy (fp32 data at 1e5 +- 1 normalises to fp32 accuracy).
    The two paths may differ in the last fp32 bits (different summation order).
    By default the result rounds where the eager chain does: the normalised, affine value
    :math:`\hat x` to ``x.dtype``, then SiLU in fp32 rounded at the store. Against the fp64
    reference that rounds at the same points (``reference.group_norm_silu_chain``) every
    element is within (``ditfuse.tools.gn_contract.contract_tolerance``)

    .. math::

        (1 + r)\,\bigl[\,r|y_{ref}| + a \;+\; \max_{|t - \hat x_{ref}| \le d} |\mathrm{silu}'(t)|
        \cdot d\,\bigr], \qquad d = r|\hat x_{ref}| + a

    with :math:`(r, a)` one rounding of the dtype (``ROUNDING``: bf16 :math:`2^{-7}, 2^{-12}`;
    fp16 :math:`2^{-10}, 2^{-14}`; fp32 2e-6, 2e-6) and :math:`\hat x_{ref}` the reference's
    rounded pre-activation. The first term is the output's rounding. The second is the
    intermediate rounding: where the fp32 statistics, which differ from the exact ones in
    the last bits, put :math:`\hat x` on the other side of a rounding midpoint, it rounds
    to the neighbouring value, and SiLU carries that spacing to the output times
    :math:`\mathrm{silu}'`: for negative :math:`\hat x` up to two roundings of the output
    (at -4), so "within one rounding of the output" does not hold for this chain. Such
    flips are rare: at most ``differ_limit`` of the elements differ from that reference
    (0.10% in bf16, 0.82% in fp16; measured 0.001-0.006% at the VAE shapes).
    Against eager ``GroupNorm -> SiLU``, which rounds at the same points, the same bound
    holds; where torch rounds the group's mean and rstd to ``x.dtype`` before applying
    them (its CUDA kernel before pytorch#183946, e.g. torch 2.11), that rounding adds
    :math:`|\sigma^{-1} w| R(\mu) + |(x - \mu) w| R(\sigma^{-1})` to :math:`d`
    (``eager_gn_stat_steps``, :math:`R(t) = r|t| + a`): 16-31% of the elements then differ
    from eager in bf16 at the VAE shapes, all within that bound.
    ``round_after_norm=False`` rounds once, at the store: within
    :math:`(1 + r)(r|y_{ref}| + a)` of the exact (fp64) result. Without SiLU the rounding
    of :math:`\hat x` is the output's own: one rounding.
    In fp32 it agrees with the eager chain to a few fp32 ulps. Inference only: no autograd.

    Examples
    --------
    >>> norm = vae.decoder.mid_block.resnets[0].norm1   # GroupNorm(32, 512, eps=1e-6)
    >>> with torch.no_grad():
    ...     h = ditfuse.group_norm_silu(h, norm.num_groups, norm.weight, norm.bias, norm.eps)
    """
    _check_grad(x, weight, bias)
    if torch.compiler.is_compiling():
        return _into(
            out,
            torch.ops.ditfuse.group_norm_silu(
                x, num_groups, weight, bias, float(eps), silu, round_after_norm
            ),
        )
    opts = dict(num_groups=num_groups, eps=eps, silu=silu, round_after_norm=round_after_norm)
    return _call(False, x, weight, bias, out, _launch, **opts)


def rms_norm_silu_channels(
    x,
    gamma,
    bias=None,
    eps=RMS_DEFAULTS.eps,
    *,
    scale=None,
    silu=RMS_DEFAULTS.silu,
    round_after_norm=RMS_DEFAULTS.round_after_norm,
    out=None,
    _launch=None,
):
    r"""Wan's channel RMS norm (``WanRMS_norm``) then SiLU, in one kernel.

    .. math::

        \hat x = \frac{x}{\max(\lVert x_{n,:,s}\rVert_2,\ \epsilon)}\cdot s\cdot\gamma_c + b_c,
        \qquad y = \hat x \cdot \sigma(\hat x)

    per sample ``n`` and spatial position ``s``, over the ``C`` channels, with
    :math:`s = \sqrt{C}` by default: diffusers' ``WanRMS_norm`` (channel-first)
    ``F.normalize(x, dim=1) * scale * gamma + bias`` then ``SiLU``, as in the Wan VAE.

    Parameters
    ----------
    x : Tensor
        Channels-first ``(N, C, *spatial)`` as for :func:`group_norm_silu`.
    gamma : Tensor or None
        ``C`` elements: ``(C,)``, ``(C, 1, 1)`` or ``(C, 1, 1, 1)`` (``norm.gamma``).
    bias : Tensor, 0.0 or None
        ``C`` elements like ``gamma``; ``0.0`` / ``None``: none (``norm.bias`` of a
        ``WanRMS_norm(bias=False)`` is the float ``0.0``).
    eps : float
        ``F.normalize``'s floor of the norm (1e-12).
    scale : float, optional
        Default ``sqrt(C)`` (``norm.scale``).
    silu, round_after_norm, out
        As for :func:`group_norm_silu`; ``round_after_norm=True`` rounds after each of the
        eager chain's steps in half precision (normalize, * scale, * gamma, + bias).

    Returns
    -------
    Tensor
        As for :func:`group_norm_silu`.

    Notes
    -----
    Numerical contract: fp32 arithmetic (sum of squares in fp32 -- every term positive, one
    pass loses nothing). By default (``round_after_norm=True``) the result rounds where
    eager ``WanRMS_norm -> SiLU`` in bf16/fp16 does: :math:`r_1` = normalize,
    :math:`r_2 = r_1 s`, :math:`r_3 = r_2\gamma`, :math:`r_4 = r_3 + b` (as present), each
    rounded to ``x.dtype``, then SiLU rounded at the store. Against the fp64 reference that
    rounds at the same points (``reference.rms_norm_silu_channels_chain``) every element is
    within (``ditfuse.tools.gn_contract.contract_tolerance``)

    .. math::

        (1 + r)\,\bigl[\,r|y_{ref}| + a \;+\; \max_{|t - v_{ref}| \le d} |\mathrm{silu}'(t)|
        \cdot d\,\bigr], \qquad
        d = s|\gamma| R(r_1) + |\gamma| R(r_2) + R(r_3) + R(r_4)

    with :math:`R(t) = r|t| + a` one rounding of the dtype (``ROUNDING``, as for
    :func:`group_norm_silu`), :math:`r_i` the reference's rounded intermediates and
    :math:`v_{ref}` its SiLU input: each intermediate rounding may land on the neighbouring
    value where fp32 and exact arithmetic straddle a rounding midpoint, and the later
    steps carry that spacing to the output (times :math:`s|\gamma|` for :math:`r_1`, s =
    sqrt(C) = 10-20 in the Wan VAE, then :math:`\mathrm{silu}'`): up to ~4 roundings of
    the output at the Wan shapes, where 0.0004-0.0006% of the elements differ (measured)
    (limit ``differ_limit``: 0.20% in bf16). Without SiLU the last rounding is the
    output's own (factor 1 for the rest). Eager rounds at the same points: the same bound.
    ``round_after_norm=False``: fp32 throughout, one rounding at the store, within
    :math:`(1 + r)(r|y_{ref}| + a)` of the exact result. In fp32 (the Wan VAE's usual
    dtype) it agrees with eager to a few fp32 ulps. Inference only: no autograd.

    Examples
    --------
    >>> norm = vae.decoder.mid_block.resnets[0].norm1   # WanRMS_norm(384, images=False)
    >>> with torch.no_grad():  # h: (N, 384, T, H, W)
    ...     h = ditfuse.rms_norm_silu_channels(h, norm.gamma, norm.bias)
    """
    _check_grad(x, gamma, bias)
    if torch.compiler.is_compiling():
        b = None if (isinstance(bias, (int, float)) and bias == 0) else bias
        return _into(
            out,
            torch.ops.ditfuse.rms_norm_silu_channels(
                x,
                gamma,
                b,
                float(eps),
                None if scale is None else float(scale),
                silu,
                round_after_norm,
            ),
        )
    opts = dict(eps=eps, scale=scale, silu=silu, round_after_norm=round_after_norm)
    return _call(True, x, gamma, bias, out, _launch, **opts)


# ---------------------------------------------------------------------------------------
# torch.library ops (torch.compile(fullgraph=True), CUDA graphs)


def _norm_op(name: str, rms: bool):
    """``@_norm_op(name, rms)`` on the annotated schema of the op ``ditfuse::<name>``,
    ``fn(x, ..., weight or gamma, bias, ...) -> Tensor`` (the body is not run): the op, which
    runs :func:`_call` (``rms``: the channel RMS norm) on the arguments by name, and its
    fake, which checks them (:func:`_plan`) and allocates."""

    def wrap(schema):
        sig = inspect.signature(schema, eval_str=True)
        names = list(sig.parameters)

        def body(fake: bool):
            def impl(*args):
                opts = dict(zip(names, args))
                x, bias = opts.pop("x"), opts.pop("bias")
                weight = opts.pop("gamma" if rms else "weight")
                if fake:
                    _plan(rms, x, weight, bias, **opts)
                    return _out_like(x)
                return _call(rms, x, weight, bias, None, None, **opts)

            impl.__signature__ = sig
            impl.__name__, impl.__doc__ = schema.__name__, schema.__doc__
            return impl

        registered = library.op(f"ditfuse::{name}", mutates_args=())(body(False))
        registered.register_fake(body(True))
        return registered

    return wrap


@_norm_op("group_norm_silu", rms=False)
def _group_norm_silu_op(
    x: torch.Tensor,
    num_groups: int,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    eps: float,
    silu: bool,
    round_after_norm: bool,
) -> torch.Tensor:
    """:func:`group_norm_silu` as an op."""


@_norm_op("rms_norm_silu_channels", rms=True)
def _rms_norm_silu_channels_op(
    x: torch.Tensor,
    gamma: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    eps: float,
    scale: Optional[float],
    silu: bool,
    round_after_norm: bool,
) -> torch.Tensor:
    """:func:`rms_norm_silu_channels` as an op."""
