"""Fused QK-norm + RoPE: validate -> allocate -> launch, the public function and its
``torch.library`` ops.

Two kernels compute the op: the flat-row kernel of :mod:`ditfuse.kernels.qk_flat` (a
token's channels as flat rows: norms across heads, or none, with interleaved RoPE over
whole heads -- Wan) where :func:`flat_applies`, else the per-token kernel of
:mod:`ditfuse.kernels.qk_token` (one token's heads as [heads, pairs] tiles: per-head norms,
any rotary layout). A quantizing call (``quantize=``) takes the kernel, and the form of it,
that the same call without ``quantize`` takes, so its 8-bit values quantize that call's
output bitwise. The pure-PyTorch
reference, also the fallback on devices Triton cannot run on, is
:func:`ditfuse.reference.qk_norm_rope_core` (and :func:`ditfuse.reference.quantize_per_token`
for the 8-bit outputs); the ``torch.library`` ops that
``torch.compile`` and CUDA-graph capture see are at the end of this module. Measurements
behind the launch tables: ``docs/design/qk_norm_rope.md``.
"""

from __future__ import annotations

import inspect
import math
import typing
from dataclasses import dataclass
from typing import List, NamedTuple, Optional

import torch
from torch import Tensor

from ditfuse.kernels.common import QUANT_CODE, NormFlags, RopeFlags
from ditfuse.kernels.qk_token import STATS_LOAD, STATS_STORE, TokenTile
from ditfuse.norms import (
    NO_NORM,
    RMS,
    NormSpec,
    check_affine,
    flatten_norm,
    needs_grad,
    resolve_norm,
    unflatten_norm,
)
from ditfuse.reference import QUANT_DTYPES, qk_norm_rope_core, quantize_per_token
from ditfuse.runtime import backend, fastpath, library

ACT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256
ROPE_STYLES = ("interleaved", "half")
LAYOUTS = ("bshd", "bhsd")
QUANTIZE = ("int8", "fp8")


class QuantizedQK(NamedTuple):
    """What :func:`qk_norm_rope` returns with ``quantize``: the 8-bit Q and K (the input's
    shape, torch.int8 or torch.float8_e4m3fn) and their fp32 scales, one per (batch, head,
    token), shape ``(B, H, S)``; ``k`` and ``k_scale`` are None when K is."""

    q: Tensor
    k: Optional[Tensor]
    q_scale: Tensor
    k_scale: Optional[Tensor]


def _check_quantize(quantize, inplace=False, out=None, process_group=None) -> None:
    """A ValueError for an unknown ``quantize`` or an argument that cannot go with it."""
    if quantize is None:
        return
    if not isinstance(quantize, str) or quantize not in QUANTIZE:
        raise ValueError(f"quantize must be None or one of {QUANTIZE}, got {quantize!r}")
    for name, given in (
        ("inplace=True", bool(inplace)),
        ("out=", out is not None),
        ("process_group", process_group is not None),
    ):
        if given:
            raise ValueError(
                f"{name} cannot be combined with quantize={quantize!r}: the 8-bit "
                "values and their scales are new tensors, computed in one kernel"
            )


@dataclass
class _Norm:
    """A resolved norm: everything the kernel needs, checked against the input's shape."""

    code: int
    weight: Optional[torch.Tensor]
    bias: Optional[torch.Tensor]
    alpha_tensor: Optional[torch.Tensor]
    alpha_value: float
    eps: float
    span_all: bool
    round_pre_w: bool
    n: int  # channels one statistic spans


@dataclass
class Plan:
    """Every argument of one call, checked, as (B, S, H, D) views (no data copied)."""

    q: torch.Tensor  # (B, S, H, D) view of the caller's q
    k: Optional[torch.Tensor]
    cos: Optional[torch.Tensor]  # (B, rows, H, W) broadcast view (stride 0 where shared)
    sin: Optional[torch.Tensor]
    positions: Optional[torch.Tensor]  # (B, S) broadcast view
    q_norm: Optional[_Norm]
    k_norm: Optional[_Norm]
    rotary_dim: int
    interleaved: bool
    table_half: bool
    table_per_head: bool
    round_after_norm: bool
    q_shape: tuple
    layout: str
    num_heads_3d: Optional[int]
    process_group: object = None


def _heads_view(x: torch.Tensor, name: str, num_heads: Optional[int], layout: str) -> torch.Tensor:
    """(B, S, H, D) view of a (B, S, H, D), (B, H, S, D) or (B, S, H*D) tensor; never a copy."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in ACT_DTYPES:
        raise TypeError(f"{name}.dtype must be float16, bfloat16 or float32, got {x.dtype}")
    if x.dim() == 3:
        if num_heads is None:
            raise ValueError(f"{name} is 3-D {tuple(x.shape)} = (B, S, H*D): pass num_heads=")
        if not isinstance(num_heads, int) or num_heads <= 0 or x.shape[2] % num_heads:
            raise ValueError(
                f"num_heads={num_heads!r} must be a positive int dividing "
                f"{name}.shape[2] = {x.shape[2]}"
            )
        return x.unflatten(2, (num_heads, x.shape[2] // num_heads))
    if x.dim() == 4:
        v = x if layout == "bshd" else x.transpose(1, 2)
        if num_heads is not None and v.shape[2] != num_heads:
            raise ValueError(
                f"num_heads={num_heads} but {name} of layout {layout!r} has "
                f"{v.shape[2]} heads (shape {tuple(x.shape)})"
            )
        return v
    raise ValueError(
        f"{name} must be 4-D (B, S, H, D) / (B, H, S, D) or 3-D (B, S, H*D) with "
        f"num_heads, got shape {tuple(x.shape)}"
    )


def _resolve_norm(norm, arg: str, x: torch.Tensor) -> Optional[_Norm]:
    spec = resolve_norm(norm, arg)
    if spec is None:
        return None
    B, S, H, D = x.shape
    span = spec.span()
    if span is None:
        span = D
    if span not in (D, H * D):
        raise ValueError(
            f"{arg} spans {span} channels; expected head_dim = {D} (per head) or "
            f"num_heads * head_dim = {H * D} (across heads)"
        )
    for pname, p in (("weight", spec.weight), ("bias", spec.bias)):
        if p is not None:
            check_affine(p, f"{arg}.{pname}", span, x, "q")
    alpha_t, alpha_v = None, 0.0
    if spec.kind == "dyt":
        a = spec.alpha
        if isinstance(a, torch.Tensor):
            if a.numel() != 1 or not a.is_floating_point():
                raise ValueError(
                    f"{arg}.alpha must be a one-element float tensor, got shape "
                    f"{tuple(a.shape)} {a.dtype}"
                )
            if a.device != x.device:
                raise ValueError(f"{arg}.alpha is on {a.device}, q is on {x.device}")
            alpha_t = a
        else:
            alpha_v = float(a)
    eps = spec.eps
    if eps is None:
        # torch.nn.RMSNorm(eps=None) takes the epsilon of its fp32 compute type
        eps = torch.finfo(torch.float32).eps if spec.kind != "dyt" else 0.0
    round_pre_w = bool(
        spec.round_before_weight
        and spec.weight is not None
        and spec.weight.dtype == x.dtype
        and x.dtype != torch.float32
    )
    return _Norm(
        code=spec.code,
        weight=spec.weight,
        bias=spec.bias,
        alpha_tensor=alpha_t,
        alpha_value=alpha_v,
        eps=float(eps),
        span_all=span == H * D and H > 1,
        round_pre_w=round_pre_w,
        n=span,
    )


def _table_view(t: torch.Tensor, name: str, B: int, S: int, H: int, rows: Optional[int]):
    """(B, rows, H, W) broadcast view of a cos/sin table, and whether it is per head.

    ``rows`` is the sequence length to match, or None when positions gather the rows.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in ACT_DTYPES:
        raise TypeError(f"{name}.dtype must be float32, bfloat16 or float16, got {t.dtype}")
    shp = tuple(t.shape)
    want = (
        f"(S, W), (B, S, W), (S, H, W), (1|B, S, 1|H, W) with S = {rows if rows else 'any'}, "
        f"B = {B}, H = {H}"
    )

    def rows_ok(n):
        return rows is None or n == rows

    if t.dim() == 2:
        if not rows_ok(shp[0]):
            raise ValueError(
                f"{name} has shape {shp}: {shp[0]} rows for {rows} tokens; expected {want}"
            )
        v = t[None, :, None, :]
    elif t.dim() == 3:
        bsw = shp[0] in (1, B) and rows_ok(shp[1])
        shw = rows_ok(shp[0]) and shp[1] == H
        if bsw and shw and shp[:2] == (1, 1):
            shw = False  # one row for every token and head: both readings are the same
        if bsw and shw:
            raise ValueError(
                f"{name} of shape {shp} is ambiguous between (B, S, W) and (S, H, W); "
                "pass it 4-D as (B, S, 1, W) or (1, S, H, W)"
            )
        if bsw:
            v = t[:, :, None, :]
        elif shw:
            v = t[None]
        else:
            raise ValueError(f"{name} has shape {shp}; expected {want}")
    elif t.dim() == 4:
        if shp[0] not in (1, B) or not rows_ok(shp[1]) or shp[2] not in (1, H):
            raise ValueError(f"{name} has shape {shp}; expected {want}")
        v = t
    else:
        raise ValueError(f"{name} has shape {shp}; expected {want}")
    per_head = v.shape[2] == H and H > 1
    v = v.expand(B, v.shape[1], H, v.shape[3])
    return v, per_head


class Options(NamedTuple):
    """The keyword arguments of :func:`qk_norm_rope` that describe the computation, with
    their public defaults: what :func:`call` takes, and :func:`plan` and :func:`op_args` as
    ``**options``."""

    q_norm: object = None
    k_norm: object = None
    num_heads: Optional[int] = None
    rope_style: str = "interleaved"
    rotary_dim: Optional[int] = None
    positions: Optional[Tensor] = None
    round_after_norm: bool = True
    layout: str = "bshd"


def plan(q, k, cos=None, sin=None, *, runtime_checks=True, process_group=None, **options) -> Plan:
    """Check every argument and describe the call; raises before anything runs.
    ``options``: the fields of :class:`Options`.

    ``runtime_checks=False`` skips the checks that read data or addresses (positions range,
    q/k aliasing), for fake tensors during tracing.
    """
    q_norm, k_norm, num_heads, rope_style, rotary_dim, positions, round_after_norm, layout = (
        Options(**options)
    )
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if rope_style not in ROPE_STYLES:
        raise ValueError(f"rope_style must be one of {ROPE_STYLES}, got {rope_style!r}")
    q4 = _heads_view(q, "q", num_heads, layout)
    B, S, H, D = q4.shape
    if D % 2 or D == 0 or D > MAX_HEAD_DIM:
        raise ValueError(
            f"head_dim must be even and at most {MAX_HEAD_DIM}, got {D} (q shape {tuple(q.shape)})"
        )
    k4 = None
    if k is not None:
        k4 = _heads_view(k, "k", num_heads, layout)
        if k.dtype != q.dtype:
            raise TypeError(f"k.dtype {k.dtype} must equal q.dtype {q.dtype}")
        if k.device != q.device:
            raise ValueError(f"k is on {k.device}, q is on {q.device}")
        if tuple(k.shape) != tuple(q.shape):
            raise ValueError(f"k.shape {tuple(k.shape)} must equal q.shape {tuple(q.shape)}")
        if runtime_checks and k.numel() and not k.is_meta and k.data_ptr() == q.data_ptr():
            raise ValueError("q and k are the same memory; pass distinct tensors")

    qn = _resolve_norm(q_norm, "q_norm", q4)
    kn = _resolve_norm(k_norm, "k_norm", q4) if k is not None else None
    if k is None and k_norm is not None:
        raise ValueError("k_norm given but k is None")

    if (cos is None) != (sin is None):
        raise ValueError("pass both cos and sin, or neither (no RoPE)")
    pos2 = None
    cos4 = sin4 = None
    R = 0
    table_half = per_head = False
    if cos is None:
        if rotary_dim is not None:
            raise ValueError("rotary_dim given without cos/sin")
        if positions is not None:
            raise ValueError("positions given without cos/sin")
    else:
        for name, t in (("cos", cos), ("sin", sin)):
            if isinstance(t, torch.Tensor) and t.device != q.device:
                raise ValueError(f"{name} is on {t.device}, q is on {q.device}")
        if positions is not None:
            if not isinstance(positions, torch.Tensor) or positions.dtype not in (
                torch.int32,
                torch.int64,
                torch.int16,
                torch.uint8,
                torch.int8,
            ):
                raise TypeError("positions must be an integer tensor of shape (S,) or (B, S)")
            if positions.device != q.device:
                raise ValueError(f"positions is on {positions.device}, q is on {q.device}")
            if positions.dim() == 1 and positions.shape[0] == S:
                pos2 = positions[None].expand(B, S)
            elif positions.dim() == 2 and positions.shape[0] in (1, B) and positions.shape[1] == S:
                pos2 = positions.expand(B, S)
            else:
                raise ValueError(
                    f"positions has shape {tuple(positions.shape)}; expected ({S},) or ({B}, {S})"
                )
        rows = None if positions is not None else S
        try:
            cos4, per_head = _table_view(cos, "cos", B, S, H, rows)
            sin4, per_head_s = _table_view(sin, "sin", B, S, H, rows)
        except ValueError as e:
            if (
                layout == "bshd"
                and q.dim() == 4
                and rows is not None
                and cos.dim() >= 2
                and q.shape[2] in tuple(cos.shape)
                and q.shape[1] not in tuple(cos.shape)
            ):
                raise ValueError(f"{e}. q looks like (B, H, S, D): pass layout='bhsd'") from None
            raise
        if tuple(cos.shape) != tuple(sin.shape):
            raise ValueError(
                f"cos.shape {tuple(cos.shape)} must equal sin.shape {tuple(sin.shape)}"
            )
        W = cos4.shape[3]
        if rotary_dim is None:
            if W == D:
                R = D
            elif 2 * W == D:
                raise ValueError(
                    f"cos has width {W} = head_dim / 2: pass rotary_dim={D} if the table holds "
                    f"unique frequencies, or rotary_dim={W} for partial rotary over the first {W} "
                    "channels (a cat-duplicated / repeat-interleaved table)"
                )
            else:
                R = W
        else:
            R = rotary_dim
        if not isinstance(R, (int, torch.SymInt)) or R <= 0 or R % 2 or R > D:
            raise ValueError(f"rotary_dim must be an even int in [2, head_dim={D}], got {R!r}")
        if W == R:
            table_half = False
        elif 2 * W == R:
            table_half = True
        else:
            raise ValueError(
                f"cos/sin width {W} fits neither rotary_dim={R} (full) nor "
                f"{R // 2} (unique frequencies)"
            )
        if runtime_checks and positions is not None and positions.numel():
            n_rows = cos4.shape[1]
            if not torch.compiler.is_compiling() and not (
                positions.is_cuda and torch.cuda.is_current_stream_capturing()
            ):
                lo, hi = int(positions.min()), int(positions.max())
                if lo < 0 or hi >= n_rows:
                    raise ValueError(
                        f"positions must lie in [0, {n_rows}) (the table's rows), "
                        f"got values in [{lo}, {hi}]"
                    )
    if process_group is not None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("process_group given but torch.distributed is not initialized")
        world = dist.get_world_size(process_group)
        for name, n in (("q_norm", qn), ("k_norm", kn)):
            if n is not None and not (n.code == RMS and (n.span_all or H == 1) and n.n == H * D):
                raise ValueError(
                    f"{name}: with process_group the norm must be an RMSNorm across "
                    f"this rank's heads (weight of H_local*D = {H * D} elements); "
                    "per-head norms need no process group"
                )
            if n is not None:
                n.n = world * H * D  # the statistic spans every rank's heads
                n.span_all = True
    return Plan(
        q=q4,
        k=k4,
        cos=cos4,
        sin=sin4,
        positions=pos2,
        q_norm=qn,
        k_norm=kn,
        rotary_dim=R,
        interleaved=rope_style == "interleaved",
        table_half=table_half,
        table_per_head=per_head,
        round_after_norm=bool(round_after_norm),
        q_shape=tuple(q.shape),
        layout=layout,
        num_heads_3d=num_heads if q.dim() == 3 else None,
        process_group=process_group,
    )


# ---------------------------------------------------------------------------------------
# launch settings: an analytical table, no autotuning (the kernels are memory-bound)


@dataclass(frozen=True)
class TokenSettings:
    """The per-token kernel's launch: ``heads`` of a token a program, held as two
    power-of-two pieces of ``piece0`` and ``piece1`` heads (``piece1`` may be 0), and the
    program's warps."""

    heads: int
    piece0: int
    piece1: int
    num_warps: int


@dataclass(frozen=True)
class FlatSettings:
    """The flat-row kernel's launch: a token's H*D channels as two power-of-two pieces of
    ``piece0`` and ``piece1`` channels (``mask0`` / ``mask1``: the piece reaches past the
    token), the program's warps, and whether Q and K run in programs of their own."""

    piece0: int
    piece1: int
    mask0: bool
    mask1: bool
    num_warps: int
    split_qk: bool


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _pow2_pieces(n: int):
    """``n`` as the largest power of two in it and the power of two covering the rest."""
    p0 = 1 << (n.bit_length() - 1)
    rest = n - p0
    return p0, (_next_pow2(rest) if rest else 0)


#: H*D of a token the flat-row kernel takes at most: 8 warps a tensor hold 48 live
#: channels a thread
FLAT_MAX_CHANNELS = 12288


def launch_settings(
    H: int,
    D: int,
    *,
    flat: bool,
    has_k: bool,
    itemsize: int,
    span_all: bool = False,
    heads: Optional[int] = None,
    num_warps: Optional[int] = None,
) -> "TokenSettings | FlatSettings":
    """The launch of one (H, D) problem: :class:`FlatSettings` for the flat-row kernel
    (``flat``; :func:`flat_applies`), else :class:`TokenSettings` for the per-token kernel.
    ``itemsize``: bytes of an activation. ``heads`` / ``num_warps`` replace the table's heads
    a program / warps of the per-token kernel (tests check that they do not change the
    bits). Measurements behind the table: ``docs/design/qk_norm_rope.md``.

    Per-token kernel: a program takes all heads of a token when the norm spans them
    (``span_all``) or the row is small (at most 8192 channels); otherwise groups of heads
    holding 4096 channels. Warps give each thread about 48 live values of Q and K, at most
    16 warps and at least 2 for 16-bit activations, 4 for fp32 (the floor measured at
    head_dim 64 x 24 heads).

    Flat-row kernel: the token's H*D channels as a power of two and the power of two
    covering the rest (5120 = 4096 + 1024, 3072 = 2048 + 1024, 1536 = 1024 + 512: no dead
    lanes). Q and K in programs of their own whenever both are given (which is also what
    lets 16-bit rows take the pair form). Warps: about 80 live channels a thread for 16-bit
    values (they stay packed as loaded), 160 for fp32 (Wan 14B and 5B: 2 warps, Wan 1.3B: 1;
    fp32: 1). The programs a SM that the registers allow set the bytes in flight; register
    caps that would allow more spill (a shipped QK build must not: ``ditfuse inspect``).
    """
    if flat:
        nc = H * D
        n0, n1 = _pow2_pieces(nc)
        per_thread = 80 if itemsize <= 2 else 160
        warps = min(8, max(1, _next_pow2(-(-(n0 + n1) // (32 * per_thread)))))
        return FlatSettings(
            piece0=n0, piece1=n1, mask0=False, mask1=n1 > nc - n0, num_warps=warps, split_qk=has_k
        )
    if heads is None:
        heads = H if span_all or H * D <= 8192 else max(1, 4096 // _next_pow2(D))
    p0, p1 = _pow2_pieces(heads)
    if num_warps is None:
        elems = (p0 + p1) * _next_pow2(D) * (2 if has_k else 1)
        target = elems / (32 * 48)
        num_warps = 1 << max(0, round(math.log2(max(target, 1e-9))))
        num_warps = min(16, max(2 if itemsize <= 2 else 4, num_warps))
    return TokenSettings(heads=heads, piece0=p0, piece1=p1, num_warps=num_warps)


def _norm_args(n: Optional[_Norm], dummy: torch.Tensor):
    """A norm's kernel arguments by name: tensors ``w``, ``b``, ``a`` (``dummy`` where
    absent), scalars ``alpha``, ``eps``, ``n`` and the flags of :class:`NormFlags`."""
    if n is None:
        return dict(
            w=dummy,
            b=dummy,
            a=dummy,
            alpha=0.0,
            eps=0.0,
            n=1.0,
            NORM=NO_NORM,
            SPAN_ALL=False,
            HAS_W=False,
            HAS_B=False,
            ALPHA_PTR=False,
            PRE=False,
        )
    return dict(
        w=n.weight if n.weight is not None else dummy,
        b=n.bias if n.bias is not None else dummy,
        a=n.alpha_tensor if n.alpha_tensor is not None else dummy,
        alpha=n.alpha_value,
        eps=n.eps,
        n=float(n.n),
        NORM=n.code,
        SPAN_ALL=n.span_all,
        HAS_W=n.weight is not None,
        HAS_B=n.bias is not None,
        ALPHA_PTR=n.alpha_tensor is not None,
        PRE=n.round_pre_w,
    )


def _norm_flags(a: dict, w_row: bool = False, words: bool = False) -> NormFlags:
    """The kernel's compile-time description of the norm of ``_norm_args`` ``a``."""
    return NormFlags(
        kind=a["NORM"],
        span_all=a["SPAN_ALL"],
        has_w=a["HAS_W"],
        has_b=a["HAS_B"],
        alpha_ptr=a["ALPHA_PTR"],
        round_pre_w=a["PRE"],
        w_row=w_row,
        words=words,
    )


def _rope_flags(p: Plan, interleaved: bool, words: bool = False, row: bool = False) -> RopeFlags:
    return RopeFlags(
        on=p.cos is not None,
        interleaved=interleaved,
        table_half=p.table_half,
        per_head=p.table_per_head,
        positions=p.positions is not None,
        words=words,
        row=row,
    )


def _launch_args(p: Plan, q_out: torch.Tensor, k_out: Optional[torch.Tensor]):
    """What the per-token and flat launches pass alike: their leading positional arguments
    (Q, K and their outputs -- Q's when there is no K: the kernel does not touch them --,
    the tables and the positions -- q itself where absent --, both norms' arguments), K and
    its output, both norms' arguments by name, and every tensor's strides as keyword
    arguments (zero strides where absent): tuples follow the tensors and scalars, which the
    launch replay (``fastpath``) substitutes by position."""
    dummy = p.q
    k, ko = (p.k, k_out) if p.k is not None else (p.q, q_out)
    if p.cos is not None:
        cos, sin, cst, sst = p.cos, p.sin, p.cos.stride(), p.sin.stride()
    else:
        cos = sin = dummy
        cst = sst = (0, 0, 0, 0)
    if p.positions is not None:
        pos, pst = p.positions, p.positions.stride()
    else:
        pos, pst = dummy, (0, 0)
    qa, ka = _norm_args(p.q_norm, dummy), _norm_args(p.k_norm, dummy)
    strides = dict(
        q_strides=p.q.stride(),
        qo_strides=q_out.stride(),
        k_strides=k.stride(),
        ko_strides=ko.stride(),
        cos_strides=cst,
        sin_strides=sst,
        pos_strides=pst,
    )
    lead = (
        p.q,
        q_out,
        k,
        ko,
        cos,
        sin,
        pos,
        qa["w"],
        qa["b"],
        qa["a"],
        ka["w"],
        ka["b"],
        ka["a"],
        qa["alpha"],
        ka["alpha"],
        qa["eps"],
        ka["eps"],
        qa["n"],
        ka["n"],
    )
    return lead, k, ko, qa, ka, strides


def launch(
    p: Plan,
    q_out: torch.Tensor,
    k_out: Optional[torch.Tensor],
    settings: Optional[TokenSettings] = None,
    stats: Optional[torch.Tensor] = None,
    stats_mode: int = 0,
    quant=None,
) -> None:
    """Run the kernel for plan ``p``, writing (B, S, H, D) views ``q_out`` / ``k_out``: the
    flat-row kernel where it applies (:func:`flat_applies`), else the per-token kernel.

    ``settings`` runs the per-token kernel with these instead of its table (tests check
    that they do not change the bits). ``stats`` / ``stats_mode`` (``STATS_STORE``,
    ``STATS_LOAD``): the head-parallel passes. ``quant`` = (format, q_scale, k_scale): 8-bit
    outputs with (B, H, S) fp32 scales, from the kernel (and its form, launch settings
    included) that the 16-bit call takes, so that the fp32 statistics run in the same order
    and the 8-bit values quantize its output bitwise (a token's heads are in one program of
    either kernel: each head's amax in the same pass).
    """
    from ditfuse.kernels.qk_token import _qk_norm_rope_kernel

    B, S, H, D = p.q.shape
    if B * S == 0 or H == 0:
        return
    if stats is None and settings is None and flat_applies(p, q_out, k_out):
        launch_flat(p, q_out, k_out, quant=quant)
        return
    has_k = p.k is not None
    span_all = bool((p.q_norm and p.q_norm.span_all) or (p.k_norm and p.k_norm.span_all))
    st = settings or launch_settings(
        H, D, flat=False, has_k=has_k, itemsize=p.q.element_size(), span_all=span_all
    )
    R2 = p.rotary_dim // 2
    P = D - p.rotary_dim
    lead, k, ko, qa, ka, strides = _launch_args(p, q_out, k_out)
    grid = (B * S, triton_cdiv(H, st.heads))
    qsc, ksc, scst = _scale_args(p, quant)
    stats = stats if stats is not None else (p.q, p.q)
    args = lead + (stats[0], stats[1], qsc, ksc, S, H)
    interleaved = p.interleaved and p.cos is not None
    # the word form where every interleaved pair is one aligned word (``_pair_words_ok``),
    # with the rows every head shares (a per-head norm's weight / bias, a table shared by
    # the heads) read once as [1, pairs] tiles broadcast over the heads: faster together,
    # either alone slower (docs/design/qk_norm_rope.md)
    words = interleaved and _pair_words_ok(p, q_out, k_out)
    w_words = words and _words_ok(_norm_tensors(p))
    constexprs = dict(
        D=D,
        R2=R2,
        TILE=TokenTile(
            heads=st.heads,
            piece0=st.piece0,
            piece1=st.piece1,
            half_pad=_next_pow2(max(R2, 1)),
            pass_pad=_next_pow2(max(P, 1)),
        ),
        Q_NORM=_norm_flags(
            qa, w_row=words and (qa["HAS_W"] or qa["HAS_B"]) and not qa["SPAN_ALL"], words=w_words
        ),
        K_NORM=_norm_flags(
            ka, w_row=words and (ka["HAS_W"] or ka["HAS_B"]) and not ka["SPAN_ALL"], words=w_words
        ),
        HAS_K=has_k,
        ROPE=_rope_flags(
            p,
            interleaved,
            words=words and not p.table_half and _words_ok([p.cos, p.sin]),
            row=words and not p.table_per_head,
        ),
        ROUND_NORM=p.round_after_norm,
        STATS=stats_mode,
        OFF64=_needs_off64(
            st.piece0 + st.piece1,
            D,
            (p.q, q_out, k, ko),
            strides["cos_strides"],
            strides["sin_strides"],
        ),
        X_WORDS=words,
    )
    if quant is not None:
        constexprs["QUANT"] = QUANT_CODE[quant[0]]
    fastpath.launch(
        _qk_norm_rope_kernel,
        grid,
        args,
        dict(
            strides,
            scale_strides=scst,
            **constexprs,
            num_warps=st.num_warps,
            enable_fp_fusion=False,
        ),
    )


def _scale_args(p: Plan, quant):
    """The scale tensors of ``quant`` (K's is Q's when there is no K: the kernels do not
    touch it) and their (B, H, S) strides, shared; q itself and zero strides without."""
    if quant is None:
        return p.q, p.q, (0, 0, 0)
    B, S, H, _ = p.q.shape
    qsc = quant[1]
    ksc = quant[2] if quant[2] is not None else qsc
    assert ksc.stride() == qsc.stride() and qsc.shape == (B, H, S)
    return qsc, ksc, qsc.stride()


def _pair_words_ok(p: Plan, q_out: torch.Tensor, k_out: Optional[torch.Tensor]) -> bool:
    """Whether every interleaved pair (2i, 2i+1) of Q, K and their outputs is one aligned
    32-bit word: 16-bit values, unit channel stride, an even head_dim, even batch / token /
    head strides and 4-byte aligned starts."""
    if p.q.element_size() != 2 or p.q.shape[3] % 2:
        return False
    for t in (p.q, q_out, p.k, k_out):
        if t is None:
            continue
        if (
            t.stride(3) != 1
            or t.data_ptr() % 4
            or any(st % 2 for st, n in zip(t.stride()[:3], t.shape[:3]) if n > 1)
        ):
            return False
    return True


def flat_applies(p: Plan, q_out: torch.Tensor, k_out: Optional[torch.Tensor]) -> bool:
    """Whether the flat-row kernel computes plan ``p``: every norm spans the token's heads
    (or there is none), the rotation (if any) is interleaved over whole heads, head_dim a
    power of two, at most ``FLAT_MAX_CHANNELS`` channels a token, no head-parallel
    statistics, and offsets within a token fit 32 bits."""
    B, S, H, D = p.q.shape
    if p.process_group is not None or H * D > FLAT_MAX_CHANNELS:
        return False
    if any(n is not None and n.n != H * D for n in (p.q_norm, p.k_norm)):
        return False
    if p.cos is not None and (p.rotary_dim != D or not p.interleaved):
        return False
    if D & (D - 1):  # channel -> (head, channel in head) by shifts
        return False
    tensors = [t for t in (p.q, q_out, p.k, k_out) if t is not None]
    cst = p.cos.stride() if p.cos is not None else (0, 0, 0, 0)
    sst = p.sin.stride() if p.sin is not None else (0, 0, 0, 0)
    return not _needs_off64(H, D, tensors, cst, sst)


def pairs_applies(
    p: Plan, q_out: torch.Tensor, k_out: Optional[torch.Tensor], row_contig: bool
) -> bool:
    """Whether the flat kernel can take its pair form (``_pairs_program`` of
    :mod:`ditfuse.kernels.qk_flat`): 16-bit Q / K whose token rows are contiguous with an
    even number of channels, every row 4-byte aligned (so each interleaved pair (2i, 2i+1)
    is one aligned 32-bit word)."""
    B, S, H, D = p.q.shape
    if not row_contig or p.q.element_size() != 2 or (H * D) % 2:
        return False
    for t in (p.q, q_out, p.k, k_out):
        if t is None:
            continue
        if t.data_ptr() % 4 or any(st % 2 for st, n in zip(t.stride()[:2], t.shape[:2]) if n > 1):
            return False
    return True


def _same_body(qa: dict, ka: dict) -> bool:
    """Whether Q's and K's norms compile to one kernel body (``_norm_args``: the same flags
    and operand dtypes), so a program can select its tensor's operands by its grid axis."""
    flags = ("NORM", "HAS_W", "HAS_B", "ALPHA_PTR", "PRE")
    return all(qa[f] == ka[f] for f in flags) and all(
        qa[t].dtype == ka[t].dtype for t in ("w", "b", "a")
    )


def _norm_tensors(p: Plan) -> list:
    """The norms' weight / bias tensors the kernel reads a channel at a time."""
    return [
        t
        for n in (p.q_norm, p.k_norm)
        if n is not None
        for t in (n.weight, n.bias)
        if isinstance(t, torch.Tensor)
    ]


def _words_ok(ts) -> bool:
    """Whether each tensor's values can be read a (2i, 2i+1) pair a 32- / 64-bit word: 16-bit
    or fp32, unit last stride, its other strides even and its start aligned to a pair."""
    for t in ts:
        es = t.element_size()
        if es not in (2, 4) or t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            return False
        if t.dim() and t.stride(-1) != 1 and t.shape[-1] > 1:
            return False
        if t.data_ptr() % (2 * es) or any(
            st % 2 for st, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1
        ):
            return False
    return True


def launch_flat(
    p: Plan,
    q_out: torch.Tensor,
    k_out: Optional[torch.Tensor],
    num_warps: Optional[int] = None,
    split: Optional[bool] = None,
    quant=None,
) -> None:
    """The flat-row kernel for plan ``p`` (``flat_applies``); ``num_warps`` and ``split`` (Q
    and K in programs of their own) override :func:`launch_settings` (tests check that they
    do not change the bits). ``quant`` = (format, q_scale, k_scale): ``q_out`` / ``k_out``
    are 8-bit, each head of a token with its fp32 scale; the form, pieces and warps are
    those of the 16-bit call (the fp32 statistics in the same order: outputs of the same
    shape and strides make the same choices)."""
    from ditfuse.kernels.qk_flat import _qk_norm_rope_flat_kernel

    B, S, H, D = p.q.shape
    has_k = p.k is not None
    lead, k, ko, qa, ka, strides = _launch_args(p, q_out, k_out)
    row_contig = all(t.stride(3) == 1 and (H == 1 or t.stride(2) == D) for t in (p.q, q_out, k, ko))
    st = launch_settings(H, D, flat=True, has_k=has_k, itemsize=p.q.element_size())
    split_qk = has_k and (st.split_qk if split is None else bool(split))
    qsc, ksc, scst = _scale_args(p, quant)
    args = lead + (qsc, ksc, S, H * D)
    # the pair form where Q and K run in programs of their own through one body; mixed
    # norms keep the channel form (two bodies measured no faster: docs/design/qk_norm_rope.md)
    pairs = split_qk and _same_body(qa, ka) and pairs_applies(p, q_out, k_out, row_contig)
    w_words = pairs and _words_ok(_norm_tensors(p))
    constexprs = dict(
        D=D,
        N0=st.piece0,
        N1=st.piece1,
        MASK0=st.mask0,
        MASK1=st.mask1,
        Q_NORM=_norm_flags(qa, words=w_words),
        K_NORM=_norm_flags(ka, words=w_words),
        HAS_K=has_k,
        ROPE=_rope_flags(
            p,
            p.interleaved and p.cos is not None,
            words=pairs and p.cos is not None and not p.table_half and _words_ok([p.cos, p.sin]),
        ),
        ROUND_NORM=p.round_after_norm,
        ROW_CONTIG=row_contig,
        SPLIT_QK=split_qk,
        PAIRS=pairs,
    )
    if quant is not None:
        constexprs["QUANT"] = QUANT_CODE[quant[0]]
    opts = dict(num_warps=num_warps or st.num_warps, enable_fp_fusion=False)
    grid = (B * S, 2 if split_qk else 1)
    fastpath.launch(
        _qk_norm_rope_flat_kernel,
        grid,
        args,
        dict(strides, scale_strides=scst, **constexprs, **opts),
    )


def _needs_off64(heads: int, D: int, tensors, cst, sst) -> bool:
    """Whether an offset within one token's program (up to ``heads`` heads of D channels,
    masked lanes included) can pass 2^31 elements: then the kernel computes them in 64 bits."""
    reach = [heads * abs(t.stride(2)) + D * abs(t.stride(3)) for t in tensors]
    reach += [heads * abs(st[2]) + D * abs(st[3]) for st in (cst, sst)]
    return max(reach) >= 2**31


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _out_like(x: torch.Tensor, p: Plan) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _as_heads(out: torch.Tensor, p: Plan) -> torch.Tensor:
    """(B, S, H, D) view of an output allocated in the caller's shape."""
    if out.dim() == 3:
        return out.unflatten(2, (p.q.shape[2], p.q.shape[3]))
    return out if p.layout == "bshd" else out.transpose(1, 2)


def _check_out(out, q, k, inplace):
    if inplace:
        raise ValueError("pass out= or inplace=True, not both")
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError("out must be a pair (q_out, k_out)")
    for name, o, x in (("out[0]", out[0], q), ("out[1]", out[1], k)):
        if x is None:
            if o is not None:
                raise ValueError(f"{name} given but k is None")
            continue
        if (
            not isinstance(o, torch.Tensor)
            or tuple(o.shape) != tuple(x.shape)
            or o.dtype != x.dtype
            or o.device != x.device
        ):
            raise ValueError(
                f"{name} must be a {x.dtype} tensor of shape {tuple(x.shape)} on "
                f"{x.device} (any strides)"
            )


def _outputs(q, k, inplace: bool, out, p: Optional[Plan] = None):
    """(q_out, k_out) in the caller's shapes: ``out``, q and k themselves, or new tensors."""
    if out is not None:
        return out[0], out[1]
    if inplace:
        return q, k
    return _out_like(q, p), (_out_like(k, p) if k is not None else None)


def _quant_empty(shape, dtype, device) -> torch.Tensor:
    """A new tensor for an 8-bit output or its scales (tests poison it)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _quant_outputs(q, k, quantize: str, num_heads, layout) -> QuantizedQK:
    """New 8-bit Q / K in the caller's shapes and their (B, H, S) fp32 scales."""
    if q.dim() == 3:
        bhs = (q.shape[0], num_heads, q.shape[1])
    elif layout == "bhsd":
        bhs = tuple(q.shape[:3])
    else:
        bhs = (q.shape[0], q.shape[2], q.shape[1])
    dt = QUANT_DTYPES[quantize]

    def values(x):
        return None if x is None else _quant_empty(x.shape, dt, x.device)

    def scales(x):
        return None if x is None else _quant_empty(bhs, torch.float32, x.device)

    return QuantizedQK(values(q), values(k), scales(q), scales(k))


def run_quantized(p: Plan, q, k, quantize: str) -> QuantizedQK:
    """Allocate the 8-bit outputs and their scales and compute them (the reference's
    quantization of its output where Triton cannot run)."""
    res = _quant_outputs(q, k, quantize, p.q.shape[2], p.layout)
    qo4 = _as_heads(res.q, p)
    ko4 = _as_heads(res.k, p) if res.k is not None else None
    if backend.kernel_device_ok(p.q):
        launch(p, qo4, ko4, quant=(quantize, res.q_scale, res.k_scale))
    else:
        for y, o4, sc in zip(
            qk_norm_rope_core(p, torch.float32), (qo4, ko4), (res.q_scale, res.k_scale)
        ):
            if y is not None:
                v, s = quantize_per_token(y, quantize)
                o4.copy_(v)
                sc.copy_(s)
    return res


def run(p: Plan, q, k, inplace: bool, out=None):
    """Allocate (unless in place or given ``out``) and compute; returns outputs in the
    caller's shapes."""
    q_out, k_out = _outputs(q, k, inplace, out, p)
    qo4 = _as_heads(q_out, p)
    ko4 = _as_heads(k_out, p) if k_out is not None else None
    if backend.kernel_device_ok(p.q):
        if p.process_group is not None:
            _launch_head_parallel(p, qo4, ko4)
        else:
            launch(p, qo4, ko4)
    else:
        if p.process_group is not None:
            raise ValueError(
                "process_group needs the Triton kernels (a CUDA device, or CPU "
                "tensors under the interpreter)"
            )
        rq, rk = qk_norm_rope_core(p, torch.float32)
        qo4.copy_(rq)
        if ko4 is not None:
            ko4.copy_(rk)
    return q_out, k_out


def _launch_head_parallel(p: Plan, qo4, ko4) -> None:
    """Heads split over ranks (tensor parallel) with an RMSNorm across all heads: each
    rank's per-token sums of squares (kernel 1), one all-reduce, then normalise and rotate
    with the global statistic (kernel 2)."""
    import torch.distributed as dist

    B, S = p.q.shape[:2]
    stats = torch.empty(2, B * S, dtype=torch.float32, device=p.q.device)
    launch(p, qo4, ko4, stats=stats, stats_mode=STATS_STORE.value)
    dist.all_reduce(stats, op=dist.ReduceOp.SUM, group=p.process_group)
    launch(p, qo4, ko4, stats=stats, stats_mode=STATS_LOAD.value)


_CACHE = fastpath.Cache()


def _norm_key(n: Optional[NormSpec]):
    if n is None:
        return None
    a = n.alpha
    return (
        n.kind,
        n.eps,
        n.size,
        n.round_before_weight,
        fastpath.sig(n.weight),
        fastpath.sig(n.bias),
        fastpath.sig(a) if isinstance(a, torch.Tensor) else a,
    )


def _slots(q, k, cos, sin, o: Options, res, inplace):
    """The tensors a recorded launch is replayed with: the inputs, the outputs ``res`` (a
    :class:`QuantizedQK` with its scales, or (q_out, k_out)) and the tensors of the norms
    of ``o`` (resolved)."""

    def tensors(n):
        if n is None:
            return None, None, None
        return n.weight, n.bias, n.alpha if isinstance(n.alpha, torch.Tensor) else None

    if isinstance(res, QuantizedQK):
        outs, scales = (res.q, res.k), (res.q_scale, res.k_scale)
    else:  # in place (in the key): the outputs are q's and k's slots
        outs, scales = ((None, None) if inplace else res), ()
    return (q, k, cos, sin, *outs, *tensors(o.q_norm), *tensors(o.k_norm), *scales)


def call(
    q,
    k,
    cos=None,
    sin=None,
    o: Options = Options(),
    *,
    inplace=False,
    out=None,
    process_group=None,
    quantize=None,
):
    """The eager call behind :func:`qk_norm_rope` and its ops: check, allocate, launch. A
    call whose signature (every tensor's shape, strides, dtype, device and alignment, the
    norms' numbers, every option, ``quantize`` included) was seen before replays its launch
    (``_fastpath``); calls with ``positions`` (their range is checked on the data) or a
    process group always take the checked path."""
    _check_quantize(quantize, inplace, out, process_group)
    key = None
    if o.positions is None and process_group is None and fastpath.usable(q):
        try:
            # the resolved norms go on to the plan (and their tensors into the slots)
            qn, kn = resolve_norm(o.q_norm, "q_norm"), resolve_norm(o.k_norm, "k_norm")
            o = Options(qn, kn, *o[2:])
            sig = fastpath.sig
            key = (
                o.num_heads,
                o.rope_style,
                o.rotary_dim,
                o.round_after_norm,
                o.layout,
                bool(inplace),
                sig(q),
                sig(k),
                sig(cos),
                sig(sin),
                _norm_key(o.q_norm),
                _norm_key(o.k_norm),
                None if out is None else tuple(map(sig, out)),
                quantize,
            )
            replay = _CACHE.get(key)
        except (AttributeError, TypeError):  # the checked path says what is wrong
            key = replay = None
        if replay is not None and not (k is not None and k.data_ptr() == q.data_ptr()):
            if quantize is not None:
                res = _quant_outputs(q, k, quantize, o.num_heads, o.layout)
            else:
                res = _outputs(q, k, inplace, out)
            if replay(_slots(q, k, cos, sin, o, res, inplace)):
                return res
    if out is not None:
        _check_out(out, q, k, inplace)
    p = plan(q, k, cos, sin, process_group=process_group, **o._asdict())
    with fastpath.Recorder() as rec:
        if quantize is not None:
            res = run_quantized(p, q, k, quantize)
        else:
            res = run(p, q, k, inplace, out)
    if key is not None:
        _CACHE.put(key, rec.replay(_slots(q, k, cos, sin, o, res, inplace)))
    return res


def _check_grad(*ts):
    """Refuses inputs that autograd would need a backward for (the op has none), with grad
    enabled; absent inputs (no K, no tables, no norm) need nothing."""
    if torch.is_grad_enabled() and any(needs_grad(t) for t in ts):
        raise RuntimeError(
            "ditfuse.qk_norm_rope is inference-only (no backward): call it "
            "under torch.no_grad() or torch.inference_mode()"
        )


def qk_norm_rope(
    q,
    k,
    cos=None,
    sin=None,
    *,
    q_norm=None,
    k_norm=None,
    num_heads=None,
    rope_style="interleaved",
    rotary_dim=None,
    positions=None,
    inplace=False,
    round_after_norm=True,
    layout="bshd",
    out=None,
    process_group=None,
    quantize=None,
):
    r"""Normalise Q and K per head (or across heads) and rotate them, in one pass.

    Inference-only: the op has no backward. With grad mode on it refuses inputs that
    require grad (a ``torch.nn`` norm's weight does): call it under ``torch.no_grad()`` or
    ``torch.inference_mode()``, as a diffusion pipeline's sampling loop does.

    .. math::

        \hat x = \mathrm{norm}(x)\odot w + b, \qquad
        \begin{pmatrix} y_a \\ y_b \end{pmatrix} =
        \begin{pmatrix} \hat x_a \cos_a - \hat x_b \sin_a \\
                        \hat x_b \cos_b + \hat x_a \sin_b \end{pmatrix}

    for every rotary pair (a, b) of every head of every token; channels past
    ``rotary_dim`` get the norm only. One read and one write of Q and K; the token's
    cos/sin row is read once and shared by all heads.

    Parameters
    ----------
    q, k : Tensor
        ``(B, S, H, D)`` (``layout="bshd"``), ``(B, H, S, D)`` (``layout="bhsd"``) or
        ``(B, S, H*D)`` with ``num_heads``; fp16, bf16 or fp32; any strides (Q/K slices of
        a packed QKV projection are read in place, never copied). ``k`` may be ``None``.
        Same shape and dtype. ``D`` even, at most 256.
    cos, sin : Tensor, optional
        The rotary tables, fp32/bf16/fp16: ``(S, W)``, ``(B, S, W)``, ``(1|B, S, 1, W)``
        shared by all heads, or per head ``(S, H, W)`` / ``(1|B, S, H, W)``. ``W`` is the
        rotary width (repeat-interleaved for ``"interleaved"``, cat-duplicated for
        ``"half"``, as diffusers builds them) or half of it (unique frequencies: one cos
        and one sin a pair, read once a pair). Any strides; a table whose columns are
        contiguous is read fastest (strided views such as a complex tensor's real part
        cost the kernel a register-layout change through shared memory: on sm_90 128
        instead of 60 registers at Qwen-Image's 24 x 128; ``ditfuse.patch`` packs such
        tables once per step). Both ``None``: no RoPE.
    q_norm, k_norm : module or NormSpec, optional
        ``torch.nn.RMSNorm``, ``torch.nn.LayerNorm``/``FP32LayerNorm``, diffusers'
        ``RMSNorm``, ``StableAudio3RMSNorm``, SAME's ``DynamicTanh`` or a
        :class:`ditfuse.NormSpec`. A weight of ``D`` elements normalises each head; one
        of ``H*D`` normalises across all heads of a token (Wan).
    num_heads : int, optional
        Needed for 3-D ``(B, S, H*D)`` inputs.
    rope_style : {"interleaved", "half"}
        Pairs ``(2i, 2i+1)`` (Wan, FLUX, Qwen, HunyuanVideo) or ``(i, i + r/2)``
        (rotate-half / NeoX: Stable Audio, SAME).
    rotary_dim : int, optional
        Channels that rotate (the first ``rotary_dim``); the rest pass through. Default:
        the table width, or ``D`` when the table is ``D`` wide. Required when the table is
        ``D/2`` wide (partial rotary and unique frequencies are otherwise ambiguous).
    positions : int Tensor, optional
        ``(S,)`` or ``(B, S)`` row index into the tables for each token. The range is
        checked (one device sync) except under ``torch.compile`` or CUDA-graph capture.
    inplace : bool
        Write the results into ``q`` and ``k`` (elements outside them are not touched,
        e.g. the V slice of a packed QKV). Otherwise new contiguous tensors are returned.
    round_after_norm : bool
        ``True`` (default): the normalised value is rounded to the activation dtype before
        the rotation, where diffusers' eager code rounds; ``False``: fp32 through to the
        single rounding at the store.
    layout : {"bshd", "bhsd"}
        How a 4-D ``q``/``k`` is laid out.
    out : (Tensor, Tensor), optional
        Where to write the results: tensors of q's / k's shape and dtype, any strides (e.g.
        slices of a concatenated text+image buffer). Not with ``inplace``.
    process_group : torch.distributed.ProcessGroup, optional
        Heads split across the ranks of this group (tensor parallel) while the norm spans
        all heads of a token (Wan's ``rms_norm_across_heads``): q/k hold this rank's heads,
        the norm weight is this rank's shard (``H_local * D``). Each rank's sums of squares
        are all-reduced before normalising: two kernels and one all-reduce of 8 bytes a
        token, equal to the single-GPU result up to the reduction order. Eager only.
    quantize : {None, "int8", "fp8"}
        ``None`` (default): outputs in the activation dtype. ``"int8"`` / ``"fp8"``: the
        same pass stores 8-bit values (torch.int8 / torch.float8_e4m3fn) with one fp32 scale
        per (batch, head, token) -- the quantization block is one head of one token, whose
        heads one program holds, norms across heads included (see Notes). Not with
        ``inplace``, ``out`` or ``process_group`` (ValueError).

    Returns
    -------
    (q_out, k_out) : tuple of Tensor
        Without ``quantize``: in the input's shape and dtype (``k_out`` is ``None`` when
        ``k`` is).
    QuantizedQK(q, k, q_scale, k_scale)
        With ``quantize``: ``q``, ``k`` new contiguous 8-bit tensors in the input's shape;
        ``q_scale``, ``k_scale`` new contiguous float32 tensors of shape ``(B, H, S)``
        (``k`` and ``k_scale`` are ``None`` when ``k`` is). Dequantized:
        ``q[b, s, h, d] * q_scale[b, h, s]`` (in the ``"bshd"`` layout).

    Notes
    -----
    Numerical contract: all arithmetic in fp32; the rotation is computed without fused
    multiply-add, exactly as eager PyTorch evaluates ``x * cos + rotate(x) * sin``. Shared
    and per-head-expanded tables give bitwise identical results (one kernel takes both: the
    flat-row kernel for a norm across heads with interleaved RoPE, such as Wan's, the
    per-token kernel otherwise; the two differ only in the order of the fp32 sum of
    squares, so a norm across heads is within a rounding, not bitwise, of the per-token
    kernel's). Against diffusers' eager
    modules the output is within one rounding of the activation dtype (the norm's
    reduction order and ``rsqrt`` may differ in the last fp32 bit; DyT's ``tanh`` is
    evaluated in fp32 to within 8 ulp -- the GPU's ``ex2`` / ``rcp`` approximations -- where
    a bf16 model would round between its steps).

    Quantization (``quantize``): ``y`` is the output the call without ``quantize`` stores
    (rounded to the activation dtype; fp32 inputs: the fp32 output), read as fp32. For each
    head row ``y[b, s, h, 0:D]``, in fp32 (IEEE round-to-nearest divisions, once a head)::

        amax  = max_d |y[d]|                (NaN if a value is NaN)
        M     = 127 ("int8")  or  448 ("fp8")
        scale = amax / M,  inv = min(M / amax, largest fp32);  both 1 where amax == 0
        int8: q = clamp(round_half_to_even(y * inv), -127, 127)
        fp8:  q = (y * inv) rounded to float8_e4m3fn, to nearest even

    Bitwise equal to :func:`ditfuse.reference.quantize_per_token` of this function's own
    16-bit output for the same arguments, a norm across heads (Wan) included: the quantizing
    call runs the kernel and form that the 16-bit call runs, so the fp32 sums of the norm
    run in the same order. A head row holding a NaN gets a NaN scale (its 8-bit values are
    then any: each dequantizes to NaN), so attention on the 8-bit output is NaN where
    attention on the 16-bit output is.

    Examples
    --------
    Wan's attention: an RMSNorm across all 40 heads of 128 channels, interleaved RoPE with
    one (S, D) table for every head:

    >>> H, D, S = 40, 128, 1024
    >>> bf16 = dict(device="cuda", dtype=torch.bfloat16)
    >>> q, k = torch.randn(1, S, H * D, **bf16), torch.randn(1, S, H * D, **bf16)
    >>> norm_q = torch.nn.RMSNorm(H * D, eps=1e-6, **bf16)
    >>> norm_k = torch.nn.RMSNorm(H * D, eps=1e-6, **bf16)
    >>> angle = torch.rand(S, D // 2, device="cuda") * 6.28
    >>> cos = angle.cos().repeat_interleave(2, -1)            # (S, D), pairs (2i, 2i+1)
    >>> sin = angle.sin().repeat_interleave(2, -1)
    >>> with torch.no_grad():
    ...     q_out, k_out = ditfuse.qk_norm_rope(q, k, cos, sin, q_norm=norm_q,
    ...                                         k_norm=norm_k, num_heads=H)
    >>> q_out.shape
    torch.Size([1, 1024, 5120])

    The same call storing int8 Q / K for 8-bit attention, a scale per head and token:

    >>> with torch.no_grad():
    ...     r = ditfuse.qk_norm_rope(q, k, cos, sin, q_norm=norm_q, k_norm=norm_k,
    ...                              num_heads=H, quantize="int8")
    >>> r.q.dtype, r.q_scale.shape
    (torch.int8, torch.Size([1, 40, 1024]))
    """
    _check_grad(q, k, cos, sin, q_norm, k_norm)
    _check_quantize(quantize, inplace, out, process_group)
    if torch.compiler.is_compiling() and process_group is not None:
        raise ValueError(
            "process_group is supported in eager mode only (call qk_norm_rope "
            "outside the compiled region, or without process_group)"
        )
    o = Options(
        q_norm, k_norm, num_heads, rope_style, rotary_dim, positions, round_after_norm, layout
    )
    if torch.compiler.is_compiling():
        if quantize is not None:
            return qk_norm_rope_quant_via_op(q, k, cos, sin, o, quantize)
        if out is not None:  # the mutating out= op: inductor writes the caller's views
            _check_out(out, q, k, inplace)
            out = tuple(out)
        return qk_norm_rope_via_op(q, k, cos, sin, o, inplace, out)
    return call(
        q, k, cos, sin, o, inplace=inplace, out=out, process_group=process_group, quantize=quantize
    )


def qk_norm_rope_reference(
    q, k, cos=None, sin=None, *, compute_dtype=torch.float32, quantize=None, **kwargs
):
    """Pure-PyTorch :func:`ditfuse.qk_norm_rope` (same arguments; ``inplace`` not taken).

    Outputs are new tensors in the caller's shapes. With ``quantize``: a
    :class:`QuantizedQK` of this function's own output, quantized by
    :func:`ditfuse.reference.quantize_per_token`.
    """
    _check_quantize(quantize)
    p = plan(q, k, cos, sin, **kwargs)
    rq, rk = qk_norm_rope_core(p, compute_dtype)

    def back(r, like):
        if r is None:
            return None
        if like.dim() == 3:
            return r.flatten(2)
        return r if p.layout == "bshd" else r.transpose(1, 2)

    oq, ok = back(rq, q), back(rk, k)
    if quantize is None:
        return oq, ok
    vq, sq = quantize_per_token(oq, quantize, layout=p.layout, num_heads=p.q.shape[2])
    vk = sk = None
    if ok is not None:
        vk, sk = quantize_per_token(ok, quantize, layout=p.layout, num_heads=p.q.shape[2])
    return QuantizedQK(vq, vk, sq, sk)


# ---------------------------------------------------------------------------------------
# torch.library ops: what torch.compile and CUDA-graph capture see (eager calls launch directly)


class OpArgs(NamedTuple):
    """The arguments every ``ditfuse::qk_norm_rope*`` op takes first, in schema order: the
    public call flattened to tensors and scalars (each norm as
    :func:`ditfuse.norms.flatten_norm` writes it). The ops' schemas are written from these
    fields (:func:`_op`)."""

    q: Tensor
    k: Optional[Tensor]
    cos: Optional[Tensor]
    sin: Optional[Tensor]
    positions: Optional[Tensor]
    q_weight: Optional[Tensor]
    q_bias: Optional[Tensor]
    q_alpha_t: Optional[Tensor]
    q_kind: int
    q_eps: float
    q_size: int
    q_alpha: float
    q_pre: bool
    k_weight: Optional[Tensor]
    k_bias: Optional[Tensor]
    k_alpha_t: Optional[Tensor]
    k_kind: int
    k_eps: float
    k_size: int
    k_alpha: float
    k_pre: bool
    num_heads: int
    rope_style: str
    rotary_dim: int
    round_after_norm: bool
    layout: str

    def options(self) -> Options:
        """The public call's :class:`Options`."""
        return Options(
            q_norm=unflatten_norm(*self[5:13]),
            k_norm=unflatten_norm(*self[13:21]),
            num_heads=self.num_heads or None,
            rope_style=self.rope_style,
            rotary_dim=self.rotary_dim or None,
            positions=self.positions,
            round_after_norm=self.round_after_norm,
            layout=self.layout,
        )


_N_OP_ARGS = len(OpArgs._fields)


def _flat(fn, signature: inspect.Signature):
    """``fn(OpArgs, *extra)`` as the function of the schema's flat arguments the dispatcher
    calls (``signature``: what ``torch.library`` reads the schema from)."""
    make = OpArgs._make

    def flat(*args):
        return fn(make(args[:_N_OP_ARGS]), *args[_N_OP_ARGS:])

    flat.__signature__ = signature
    flat.__name__, flat.__doc__ = fn.__name__, fn.__doc__
    return flat


def _op(name: str, returns, mutates_args=(), extra=()):
    """``@_op(name, returns, ...)`` on ``fn(a: OpArgs, *extra)``: the op ``ditfuse::<name>``
    with the schema of :class:`OpArgs`' fields, then ``extra`` ((name, type) pairs); its
    ``.register_fake`` takes a fake of the same form."""
    fields = typing.get_type_hints(OpArgs)
    params = [
        inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=t)
        for n, t in (*fields.items(), *extra)
    ]
    signature = inspect.Signature(params, return_annotation=returns)

    def wrap(fn):
        registered = library.op(f"ditfuse::{name}", mutates_args=mutates_args)(_flat(fn, signature))
        register_fake = registered.register_fake
        registered.register_fake = lambda fake: register_fake(_flat(fake, signature))
        return registered

    return wrap


def _fake_plan(a: OpArgs) -> Plan:
    """The plan of an op's arguments on fake tensors: bad input fails while tracing."""
    return plan(a.q, a.k, a.cos, a.sin, runtime_checks=False, **a.options()._asdict())


@_op("qk_norm_rope", List[Tensor])
def qk_norm_rope_op(a: OpArgs) -> List[Tensor]:
    """The functional form: [q_out] or [q_out, k_out]."""
    qo, ko = call(a.q, a.k, a.cos, a.sin, a.options())
    return [qo] if ko is None else [qo, ko]


@qk_norm_rope_op.register_fake
def _(a: OpArgs):
    _fake_plan(a)
    outs = [torch.empty(a.q.shape, dtype=a.q.dtype, device=a.q.device)]
    if a.k is not None:
        outs.append(torch.empty(a.k.shape, dtype=a.k.dtype, device=a.k.device))
    return outs


@_op("qk_norm_rope_", None, mutates_args=("q", "k"))
def qk_norm_rope_inplace_op(a: OpArgs) -> None:
    """The ``inplace=True`` form."""
    call(a.q, a.k, a.cos, a.sin, a.options(), inplace=True)


@qk_norm_rope_inplace_op.register_fake
def _(a: OpArgs):
    return None


@_op(
    "qk_norm_rope_out",
    None,
    mutates_args=("q_out", "k_out"),
    extra=(("q_out", Tensor), ("k_out", Optional[Tensor])),
)
def qk_norm_rope_out_op(a: OpArgs, q_out: Tensor, k_out: Optional[Tensor]) -> None:
    """The ``out=`` form: results written into the caller's buffers (the joint-attention
    processors' rows of the joint Q / K). A mutating op, so inductor writes the views of
    the joint buffer in place instead of a functional result plus a copy into the rows."""
    call(a.q, a.k, a.cos, a.sin, a.options(), out=(q_out, k_out))


@qk_norm_rope_out_op.register_fake
def _(a: OpArgs, q_out, k_out):
    _fake_plan(a)
    return None


@_op("qk_norm_rope_quant", List[Tensor], extra=(("quantize", str),))
def qk_norm_rope_quant_op(a: OpArgs, quantize: str) -> List[Tensor]:
    """The ``quantize=`` form: [q, q_scale] or [q, k, q_scale, k_scale] (8-bit values in
    the input's shape, (B, H, S) fp32 scales)."""
    r = call(a.q, a.k, a.cos, a.sin, a.options(), quantize=quantize)
    return [r.q, r.q_scale] if r.k is None else [r.q, r.k, r.q_scale, r.k_scale]


@qk_norm_rope_quant_op.register_fake
def _(a: OpArgs, quantize):
    _check_quantize(quantize)
    p = _fake_plan(a)
    B, S, H, _ = p.q.shape
    dt = QUANT_DTYPES[quantize]
    values = [torch.empty(x.shape, dtype=dt, device=x.device) for x in (a.q, a.k) if x is not None]
    scales = [torch.empty(B, H, S, dtype=torch.float32, device=a.q.device) for _ in values]
    return values + scales


def op_args(q, k, cos, sin, **options) -> OpArgs:
    """The ops' leading arguments for a call with ``options`` (fields of :class:`Options`)."""
    return _op_args(q, k, cos, sin, Options(**options))


def _op_args(q, k, cos, sin, o: Options) -> OpArgs:
    return OpArgs(
        q,
        k,
        cos,
        sin,
        o.positions,
        *flatten_norm(o.q_norm, "q_norm"),
        *flatten_norm(o.k_norm, "k_norm"),
        int(o.num_heads or 0),
        o.rope_style,
        int(o.rotary_dim or 0),
        bool(o.round_after_norm),
        o.layout,
    )


def qk_norm_rope_via_op(q, k, cos, sin, o: Options, inplace: bool, out=None):
    args = _op_args(q, k, cos, sin, o)
    if out is not None:
        torch.ops.ditfuse.qk_norm_rope_out(*args, out[0], out[1])
        return out[0], out[1]
    if inplace:
        torch.ops.ditfuse.qk_norm_rope_(*args)
        return q, k
    outs = torch.ops.ditfuse.qk_norm_rope(*args)
    return outs[0], (outs[1] if k is not None else None)


def qk_norm_rope_quant_via_op(q, k, cos, sin, o: Options, quantize: str) -> QuantizedQK:
    outs = torch.ops.ditfuse.qk_norm_rope_quant(*_op_args(q, k, cos, sin, o), quantize)
    if k is None:
        return QuantizedQK(outs[0], None, outs[1], None)
    return QuantizedQK(outs[0], outs[1], outs[2], outs[3])
