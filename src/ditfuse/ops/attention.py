"""Sliding-window (and differential) attention: the launch table, validate -> allocate ->
launch, the public function, and at the end its ``torch.library`` op (with a fake
implementation; eager calls launch directly, only code being compiled goes through it).

The kernels are in :mod:`ditfuse.kernels.attention` (Triton) and, for SAME-L's
differential entries on sm_90, :mod:`ditfuse.kernels.attention_sm90` (16-bit) and
:mod:`ditfuse.kernels.attention_sm90_fp32` (Gluon); the QK-norm + RoPE prologue, where it
runs apart, is :mod:`ditfuse.ops.qk_norm_rope`. The pure-PyTorch reference (the dense-mask
formula, also the fallback for devices Triton cannot run on) is in :mod:`ditfuse.reference`;
the ``ditfuse check`` gates in :mod:`ditfuse.tools.check_attention`. Inference only.
Measurements behind the table and the routes: docs/design/attention.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
import triton
from torch import Tensor

from ditfuse import tolerances
from ditfuse.kernels.common import NormArgs, NormFlags, RopeFlags
from ditfuse.norms import flatten_norm, needs_grad, unflatten_norm
from ditfuse.ops import qk_norm_rope as qk_ops
from ditfuse.reference import sliding_window_attention_core
from ditfuse.runtime import backend, fastpath, library
from ditfuse.runtime.backend import mma_sync_only

ACT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: the largest head_dim the kernel takes; any head_dim up to it works (tiles are padded to a
#: power of two >= 16: 32, 64 and 128 run unpadded, e.g. 80 or 96 on 128-wide tiles)
MAX_HEAD_DIM = 128
LAYOUTS = ("bshd", "bhsd")
ROPE_STYLES = ("half", "interleaved")
LOG2E = 1.4426950408889634
#: Accuracy against the fp64 formula, as a share of ``|ref| + (1 + |lam|) rms(v)``.
ACCURACY = tolerances.ATTENTION
#: fp32 at precision="highest" (three-term tf32 products), the same share
ACCURACY_HIGHEST = tolerances.ATTENTION_HIGHEST


@dataclass
class Plan:
    """Every argument of one call, checked, as (B, N, H, D) views (no data copied)."""

    q: Tensor
    k: Tensor
    v: Tensor
    q2: Optional[Tensor]
    k2: Optional[Tensor]
    left: int  # -1: unbounded
    right: int  # -1: unbounded
    lam_value: float
    lam_tensor: Optional[Tensor]  # (H,) view (stride 0 when one value for all heads)
    scale: float
    layout: str
    qk: Optional[object]  # qk_norm_rope.Plan of the prologue on (q, k), or None
    dot_prec: str = "tf32"  # fp32 products: "tf32" or "tf32x3" (PRECISIONS)

    @property
    def differential(self) -> bool:
        return self.q2 is not None


def parse_window(window):
    """``window`` as (left, right): an int w is (w, w); -1 on a side is unbounded."""
    if isinstance(window, bool):
        raise TypeError(f"window must be an int or a (left, right) pair, got {window!r}")
    if isinstance(window, (tuple, list)):
        if len(window) != 2:
            raise ValueError(f"window must be an int w or a (left, right) pair, got {window!r}")
        pair = tuple(window)
    else:
        pair = (window, window)
    out = []
    for side, w in zip(("left", "right"), pair):
        if isinstance(w, bool):
            raise TypeError(f"window {side} must be an int, got {w!r}")
        try:
            w = operator.index(w)
        except TypeError:
            raise TypeError(
                f"window {side} must be an int (>= 0, or -1 for unbounded), got "
                f"{type(w).__name__} {w!r}"
            ) from None
        if w < -1:
            raise ValueError(
                f"window {side} = {w}: must be >= 0 (keys that far from the query "
                "on that side), or -1 for unbounded"
            )
        out.append(int(w))
    return out[0], out[1]


def _heads(x, name: str, layout: str) -> Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in ACT_DTYPES:
        raise TypeError(f"{name}.dtype must be float16, bfloat16 or float32, got {x.dtype}")
    if x.dim() != 4:
        want = "(B, N, H, D)" if layout == "bshd" else "(B, H, N, D)"
        raise ValueError(
            f"{name} must be 4-D {want} (layout={layout!r}), got shape "
            f"{tuple(x.shape)}; unflatten packed heads with "
            f"x.unflatten(-1, (heads, head_dim))"
        )
    return x if layout == "bshd" else x.transpose(1, 2)


#: ``precision`` (PyTorch's float32 matmul precisions) -> how fp32 Q K^T and P V multiply:
#: "highest" fp32-accurate (each operand split into two tf32 terms, three tensor-core
#: products: Triton's "tf32x3"), "high" / "medium" one tf32 product (10-bit mantissas)
PRECISIONS = {"highest": "tf32x3", "high": "tf32", "medium": "tf32"}


@torch.compiler.assume_constant_result
def _matmul_precision() -> str:
    """``torch.get_float32_matmul_precision()``; under torch.compile a constant of the trace
    (a setting changed afterwards takes a recompile, as for torch.matmul's own kernels)."""
    return torch.get_float32_matmul_precision()


def dot_precision(dtype, precision=None) -> str:
    """The kernel's fp32 product form for ``precision`` (None: PyTorch's
    ``torch.get_float32_matmul_precision()``, read at the call); "tf32" for 16-bit inputs,
    whose operands are exact on the tensor cores."""
    if precision is None:
        precision = _matmul_precision()
    elif not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(
            f"precision must be one of {sorted(PRECISIONS)} (PyTorch's float32 "
            f"matmul precisions) or None, got {precision!r}"
        )
    return PRECISIONS[precision] if dtype == torch.float32 else "tf32"


class Options(NamedTuple):
    """The keyword arguments of :func:`sliding_window_attention` with their public defaults:
    what :func:`plan` and :func:`op_args` take as ``**options``, and the replay key and the
    op as one value (a NamedTuple: ``torch.compile`` traces the public function through it)."""

    q2: Optional[Tensor] = None
    k2: Optional[Tensor] = None
    lam: object = 1.0
    scale: Optional[float] = None
    layout: str = "bshd"
    q_norm: object = None
    k_norm: object = None
    cos: Optional[Tensor] = None
    sin: Optional[Tensor] = None
    rope_style: str = "half"
    rotary_dim: Optional[int] = None
    precision: Optional[str] = None


def plan(q, k, v, window, **options) -> Plan:
    """Check every argument and describe the call; raises before anything runs. Reads no
    tensor data (works on fake / meta tensors). ``options``: the fields of :class:`Options`."""
    q2, k2, lam, scale, layout, q_norm, k_norm, cos, sin, rope_style, rotary_dim, precision = (
        Options(**options)
    )
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if rope_style not in ROPE_STYLES:
        raise ValueError(f"rope_style must be one of {ROPE_STYLES}, got {rope_style!r}")
    if (q2 is None) != (k2 is None):
        given, missing = ("q2", "k2") if q2 is not None else ("k2", "q2")
        raise ValueError(
            f"{given} given without {missing}: differential attention needs both "
            "(out = Attn(q, k, v) - lam * Attn(q2, k2, v))"
        )
    names = ["q", "k", "v"] + (["q2", "k2"] if q2 is not None else [])
    raw = dict(q=q, k=k, v=v, q2=q2, k2=k2)
    views = {n: _heads(raw[n], n, layout) for n in names}
    q4 = views["q"]
    for n in names[1:]:
        t = raw[n]
        if t.dtype != q.dtype:
            raise TypeError(f"{n}.dtype {t.dtype} must equal q.dtype {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"{n} is on {t.device}, q is on {q.device}")
    B, N, H, D = q4.shape
    for n in names[1:]:
        if views[n].shape[3] != D:
            raise ValueError(
                f"head_dim mismatch: {n} has head_dim {views[n].shape[3]}, q has "
                f"{D} (shapes {tuple(raw[n].shape)} vs {tuple(q.shape)})"
            )
    if not head_dim_ok(D):
        raise ValueError(
            f"head_dim must be between 1 and {MAX_HEAD_DIM}, got {D} (q shape "
            f"{tuple(q.shape)}); use the reference "
            "ditfuse.sliding_window_attention_reference for others"
        )
    for n in names[1:]:
        if tuple(views[n].shape) != (B, N, H, D):
            raise ValueError(
                f"{n}.shape {tuple(raw[n].shape)} must equal q.shape "
                f"{tuple(q.shape)} (self-attention over one sequence: same batch, "
                "tokens and heads)"
            )
    if N >= 2**30:
        raise ValueError(
            f"q has {N} tokens; the kernel's token indices are int32 (at most 2^30 - 1 tokens)"
        )
    left, right = parse_window(window)

    lam_t = None
    lam_v = 1.0
    if isinstance(lam, torch.Tensor):
        if q2 is None:
            raise ValueError(
                "lam is a tensor but q2/k2 are not given: lam is the weight of the "
                "second attention map of differential attention"
            )
        if not lam.is_floating_point():
            raise TypeError(f"lam.dtype must be floating point, got {lam.dtype}")
        if lam.device != q.device:
            raise ValueError(f"lam is on {lam.device}, q is on {q.device}")
        if lam.dim() > 1 or lam.numel() not in (1, H):
            raise ValueError(
                f"lam must be a float, a one-element tensor or a per-head tensor of "
                f"shape ({H},), got shape {tuple(lam.shape)}"
            )
        lam_t = lam.reshape(-1).expand(H) if lam.numel() == 1 else lam
    else:
        if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not math.isfinite(lam):
            raise TypeError(f"lam must be a finite float or a ({H},) tensor, got {lam!r}")
        lam_v = float(lam)
        if q2 is None and lam_v != 1.0:
            raise ValueError(
                f"lam={lam_v} given without q2/k2: lam is the weight of the second "
                "attention map of differential attention"
            )

    if scale is None:
        sc = 1.0 / math.sqrt(D)
    else:
        if (
            isinstance(scale, bool)
            or not isinstance(scale, (int, float))
            or not math.isfinite(scale)
            or scale <= 0
        ):
            raise ValueError(
                f"scale must be a positive finite float (default 1/sqrt(head_dim)), got {scale!r}"
            )
        sc = float(scale)

    qkp = None
    if (
        q_norm is not None
        or k_norm is not None
        or cos is not None
        or sin is not None
        or rotary_dim is not None
    ):
        qkp = qk_ops.plan(
            q,
            k,
            cos,
            sin,
            q_norm=q_norm,
            k_norm=k_norm,
            rope_style=rope_style,
            rotary_dim=rotary_dim,
            layout=layout,
            runtime_checks=False,
        )
        for arg, n in (("q_norm", qkp.q_norm), ("k_norm", qkp.k_norm)):
            if n is not None and n.span_all:
                raise ValueError(
                    f"{arg} normalises across all {H} heads ({H * D} channels); the "
                    "fused prologue normalises per head: apply "
                    "ditfuse.qk_norm_rope first and pass q_norm/k_norm=None"
                )
    return Plan(
        q4,
        views["k"],
        views["v"],
        views.get("q2"),
        views.get("k2"),
        left,
        right,
        lam_v,
        lam_t,
        sc,
        layout,
        qkp,
        dot_precision(q4.dtype, precision),
    )


# ---------------------------------------------------------------------------------------
# launch settings: a small analytical table


@dataclass(frozen=True)
class Settings:
    """One launch of the Triton kernel (fields by name; :func:`launch` also takes a tuple of
    the leading fields as an override).

    ``token_major``: None orders the grid by layout (see :func:`launch`); ``maxnreg`` caps the
    registers a thread (ptxas ``.maxnreg``; None: no cap); ``step_m``: the queries a program
    stores (None: ``block_m``; :func:`query_step`); ``mma_sync``: dots on mma.sync where
    Triton would take wgmma (:func:`ditfuse.runtime.backend.mma_sync_only`); ``split_pv``:
    P @ V and the store in two column halves (see :func:`launch`)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    token_major: Optional[bool] = None
    maxnreg: Optional[int] = None
    step_m: Optional[int] = None
    mma_sync: bool = False
    split_pv: bool = False

    @classmethod
    def of(cls, settings) -> "Settings":
        """``settings`` as a :class:`Settings`: itself, or a tuple of the leading fields."""
        return settings if isinstance(settings, cls) else cls(*settings)

    def is_entry(self, entry: "Settings") -> bool:
        """Whether these are ``entry``'s settings, whatever the query step."""
        return dataclasses.replace(self, step_m=entry.step_m) == entry


def query_step(block_m: int, block_n: int, left: int, right: int) -> int:
    """Queries a program stores (of its ``block_m`` rows): fewer than ``block_m`` where that
    saves a key tile a program and at least 10% of the key slots a query.

    A tile of s queries visits ``ceil((s + left + right) / block_n)`` key tiles. At SAME's
    window 17 a 64-query tile spans 98 keys: 4 tiles of 32, two keys into the fourth; 62
    queries span 96 keys, 3 tiles (96 key slots for 62 queries instead of 128 for 64, 3.5%
    more programs). Unbounded sides (``-1``) keep ``block_m``.
    """
    if left < 0 or right < 0:
        return block_m
    span = left + right
    trips = -(-(block_m + span) // block_n)
    s = (trips - 1) * block_n - span
    if s < (block_m + 1) // 2 or (trips - 1) * block_m > 0.9 * trips * s:
        return block_m
    return s


#: SAME-L's 16-bit differential entry (head_dim 64, narrow band, no prologue): one wgmma
#: warpgroup, capped at 168 registers (3 programs an SM); on sm_90 the Gluon kernel of
#: :mod:`ditfuse.kernels.attention_sm90` runs its launches (:func:`gluon_ok`)
SAME_L_16BIT = Settings(block_m=64, block_n=32, num_warps=4, num_stages=3, maxnreg=168)
#: SAME-L's fp32 entry (head_dim 64, narrow band, no prologue; differential or plain): two
#: mma.sync warps of 16 query rows sharing each K / V tile, P @ V in column halves; on sm_90
#: the differential launches run :mod:`ditfuse.kernels.attention_sm90_fp32` (:func:`gluon_ok`)
SAME_L_FP32 = Settings(
    block_m=32, block_n=16, num_warps=2, num_stages=3, token_major=True, maxnreg=168, split_pv=True
)


@dataclass(frozen=True)
class _Case:
    """The conditions of a measured table row; None: any. ``tile_d``: :func:`tile_dim`;
    ``narrow``: a band of at most 64 keys (``left + right + 1``); ``tf32x3``: fp32 products
    at ``precision="highest"``."""

    tile_d: Optional[int] = None
    fp32: Optional[bool] = None
    tf32x3: Optional[bool] = None
    differential: Optional[bool] = None
    prologue: Optional[bool] = None
    narrow: Optional[bool] = None

    def matches(self, call: "_Case") -> bool:
        return all(
            want is None or want == getattr(call, f.name)
            for f in dataclasses.fields(self)
            for want in (getattr(self, f.name),)
        )


#: The measured rows (the measurements behind each: docs/design/attention.md, "Launch
#: table"); no two rows match one call. Every other call takes :func:`_analytical_settings`.
_MEASURED = (
    # fp32 "highest" (three products a dot), differential: the tf32 rows' caps spill there
    (
        _Case(tile_d=64, fp32=True, tf32x3=True, differential=True, prologue=True),
        Settings(block_m=64, block_n=16, num_warps=8, num_stages=2),
    ),
    (
        _Case(tile_d=64, fp32=True, tf32x3=True, differential=True, prologue=False, narrow=True),
        Settings(
            block_m=32, block_n=16, num_warps=2, num_stages=3, token_major=True, split_pv=True
        ),
    ),
    # the fused prologue at SAME-L's shape in 16-bit (the public call runs it apart:
    # prologue_apart; this row is the fused launch of a plan that carries the prologue)
    (
        _Case(tile_d=64, fp32=False, differential=True, prologue=True, narrow=True),
        Settings(block_m=64, block_n=16, num_warps=4, num_stages=3, maxnreg=168),
    ),
    # SAME-L's attention, differential and plain
    (_Case(tile_d=64, fp32=False, differential=True, prologue=False, narrow=True), SAME_L_16BIT),
    (
        _Case(tile_d=64, fp32=True, tf32x3=False, differential=True, prologue=False, narrow=True),
        SAME_L_FP32,
    ),
    (
        _Case(tile_d=64, fp32=False, differential=False, prologue=False, narrow=True),
        Settings(block_m=64, block_n=32, num_warps=4, num_stages=3),
    ),
    (_Case(tile_d=64, fp32=True, differential=False, prologue=False, narrow=True), SAME_L_FP32),
    # head_dim 128 (and those padded to it), differential: two 4-warp programs an SM
    (
        _Case(tile_d=128, fp32=False, differential=True, prologue=False),
        Settings(block_m=64, block_n=16, num_warps=4, num_stages=3),
    ),
    (
        _Case(tile_d=128, fp32=True, differential=True, prologue=False),
        Settings(block_m=64, block_n=16, num_warps=4, num_stages=2),
    ),
)


def _analytical_settings(c: _Case) -> Settings:
    """The register budget's rule for the calls no measured row takes.

    * block_m = 64: the M of one Hopper wgmma (one warpgroup of 4 warps).
    * block_n = 32: a narrow band's query tile visits ``(64 + left + right + 31) / 32`` key
      tiles on average (~129 keys per 64 queries, where 64-key tiles would visit ~161 and
      double the score registers); 16 at head_dim 128 when differential (two maps of [64,
      128] state). A wide band without differential / prologue (16-bit up to head_dim 64,
      fp32 at 32) takes 64-key tiles and a 3-stage pipeline.
    * num_warps = 8 (two warpgroups splitting the tile) where 4 warps would pass ~200
      registers: head_dim 64 differential with the prologue or fp32 operands; head_dim 128
      differential or with the prologue. Otherwise 4.
    * num_stages = 2 otherwise: a narrow band makes 3-5 loop trips; deeper pipelines only
      fill shared memory (at most 112 KB here, below the 227 KB of a Hopper block).
    """
    if c.tile_d >= 128:
        block_n = 16 if c.differential else 32
        warps = 8 if (c.differential or c.prologue) else 4
    elif c.tile_d >= 64:
        block_n = 32
        warps = 8 if c.differential and (c.prologue or c.fp32) else 4
    else:
        block_n, warps = 32, 4
    plain = not c.differential and not c.prologue
    if not c.narrow and plain and c.tile_d <= (32 if c.fp32 else 64):
        return Settings(block_m=64, block_n=64, num_warps=warps, num_stages=3)
    return Settings(block_m=64, block_n=block_n, num_warps=warps, num_stages=2)


def launch_settings(
    D: int,
    dtype: torch.dtype,
    left: int,
    right: int,
    N: int,
    differential: bool,
    prologue: bool,
    prec: str = "tf32",
) -> Settings:
    """The :class:`Settings` of one call: a small table, no autotuning.

    A program holds, per map (two when differential), a [BLOCK_M, D] fp32 accumulator, the
    Q tile and [BLOCK_M, BLOCK_N] fp32 scores/probabilities; the prologue adds the K tile's
    norm/rotation operands. The table keeps every specialization at most 255 registers a
    thread with no local memory inside its loops and at most ``LOCAL_BYTES_MAX`` bytes
    outside them (``ptxas -v`` and the SASS of the CPU-side sm_90 build, tests and
    ``build_report``). A measured row (``_MEASURED``) where one matches, else the register
    budget's rule (:func:`_analytical_settings`); then, where the band is bounded on both
    sides, the query step (:func:`query_step`: a program stores only as many of its
    ``block_m`` queries as span one key tile fewer).
    """
    span = (N if left < 0 else left) + (N if right < 0 else right) + 1
    call = _Case(
        tile_d=tile_dim(D),
        fp32=dtype == torch.float32,
        tf32x3=prec == "tf32x3",
        differential=differential,
        prologue=prologue,
        narrow=span <= 64,
    )
    st = next((s for case, s in _MEASURED if case.matches(call)), None) or _analytical_settings(
        call
    )
    if left < 0 or right < 0:
        return st
    return dataclasses.replace(
        st, step_m=query_step(st.block_m, st.block_n, min(left, N), min(right, N))
    )


def head_dim_ok(D: int) -> bool:
    """Whether the kernel takes head_dim ``D`` (1 .. MAX_HEAD_DIM)."""
    return 1 <= D <= MAX_HEAD_DIM


@functools.lru_cache(maxsize=None)  # on the replay path (prologue_apart): a dict look-up
def tile_dim(D: int) -> int:
    """The kernel's tile width for head_dim ``D``: D padded to a power of two >= 16 (a
    dot's least K). Launch settings and routing go by it: a padded tile holds the registers
    of its padded width."""
    return max(16, triton.next_power_of_2(D))


def _norm_args(n, dummy: Tensor):
    """A norm's tensors (weight, bias, DyT's alpha: ``dummy`` where absent), its
    :class:`NormFlags` and :class:`NormArgs` (``n`` None: no norm)."""
    a = qk_ops._norm_args(n, dummy)
    flags = NormFlags(
        kind=a["NORM"],
        has_w=a["HAS_W"],
        has_b=a["HAS_B"],
        alpha_ptr=a["ALPHA_PTR"],
        round_pre_w=a["PRE"],
    )
    return (a["w"], a["b"], a["a"]), flags, NormArgs(alpha=a["alpha"], eps=a["eps"], n=a["n"])


def _fits_int32(p: Plan, o4: Tensor, block: int) -> bool:
    """Offsets inside one tile (BLOCK rows, D columns) fit int32 for every operand."""
    lim = 2**31 - 1
    ts = [p.q, p.k, p.v, o4] + [t for t in (p.q2, p.k2) if t is not None]
    if p.qk is not None and p.qk.cos is not None:
        ts += [p.qk.cos, p.qk.sin]
    for t in ts:
        st = t.stride()
        if (block - 1) * st[1] + (t.shape[3] - 1) * st[3] > lim:
            return False
    return True


def launch(p: Plan, o4: Tensor, settings=None) -> None:
    """Run the kernel for plan ``p``, writing the (B, N, H, D) view ``o4``.

    ``settings`` (a :class:`Settings`, or a tuple of its leading fields) overrides the table.
    ``token_major`` (default: the head stride is below the token stride, as in bshd) orders
    the grid query tile first, every (batch, head) of it next; ``maxnreg`` caps the
    registers a thread (ptxas ``.maxnreg``; None: no cap); ``step_m`` the queries a program
    stores, 1 .. BLOCK_M (None: BLOCK_M; :func:`query_step`); ``mma_sync`` compiles the dots
    to mma.sync where Triton would take wgmma (a 64-row tile on 4 warps then runs
    FlashAttention-2's layout, each warp owning 16 query rows:
    :func:`ditfuse.runtime.backend.mma_sync_only`; no table entry takes it); ``split_pv``
    computes P @ V and stores the output as two halves of the tile's columns (the same
    arithmetic a column; on the GPU other last bits than the column-split tile): Triton
    gives a chain of mma.sync dots one warp layout, and a [BLOCK_M, D] product with
    BLOCK_M < D splits its columns across the warps; the halves put them along the rows.
    Without ``settings``, a call that :func:`gluon_ok` accepts (SAME-L's differential
    entries on sm_90) runs a Gluon kernel: :mod:`ditfuse.kernels.attention_sm90`'s in 16-bit
    (the same tiles and bits), :mod:`ditfuse.kernels.attention_sm90_fp32`'s in fp32 (64 /
    32-key tiles: within the fp32 contract, not the Triton kernel's bits).
    """
    from ditfuse.kernels.attention import _swa_fwd_kernel

    B, N, H, D = p.q.shape
    if B * N * H == 0:
        return
    diff = p.differential
    st = Settings.of(
        settings
        or launch_settings(D, p.q.dtype, p.left, p.right, N, diff, p.qk is not None, p.dot_prec)
    )
    bm, bn = st.block_m, st.block_n
    token_major = (
        bool(st.token_major) if st.token_major is not None else p.q.stride(2) < p.q.stride(1)
    )
    cap = {"maxnreg": int(st.maxnreg)} if st.maxnreg else {}
    step = int(st.step_m) if st.step_m is not None else bm
    if not 1 <= step <= bm:
        raise ValueError(f"settings: step_m must be in 1 .. block_m = {bm}, got {step}")
    mma_sync = bool(st.mma_sync)
    split_pv = bool(st.split_pv)
    if split_pv and tile_dim(D) < 32:
        raise ValueError(f"settings: split_pv needs a tile of >= 32 columns (head_dim {D})")
    # an unbounded side reaches every token; clamp to N so int32 sums cannot overflow
    left = N if p.left < 0 else min(p.left, N)
    right = N if p.right < 0 else min(p.right, N)
    if settings is None and gluon_ok(p, o4, st):
        _launch_gluon(p, o4, left, right, step, token_major)
        return
    grid, token_major = _grid(B * H, N, step, token_major)
    dummy = p.q
    qk = p.qk
    q_norm, q_flags, q_args = _norm_args(qk.q_norm if qk is not None else None, dummy)
    k_norm, k_flags, k_args = _norm_args(qk.k_norm if qk is not None else None, dummy)
    rope = qk is not None and qk.cos is not None
    if rope:
        cos, sin = qk.cos, qk.sin
        R = qk.rotary_dim
    else:
        cos = sin = dummy
        R = 0
    q2, k2 = (p.q2, p.k2) if diff else (p.q, p.k)
    lam_t = p.lam_tensor if p.lam_tensor is not None else dummy
    lam_st = p.lam_tensor.stride(0) if p.lam_tensor is not None else 0
    # tensors and the scalars before the tuples by position (a replay puts a call's tensors
    # in their places), the rest by keyword (fixed for a recorded signature)
    args = (
        p.q,
        p.k,
        p.v,
        q2,
        k2,
        o4,
        lam_t,
        *q_norm,
        *k_norm,
        cos,
        sin,
        p.lam_value,
        p.scale * LOG2E,
    )
    kwargs = dict(
        q_args=q_args,
        k_args=k_args,
        N=N,
        LEFT=left,
        RIGHT=right,
        q_strides=p.q.stride(),
        k_strides=p.k.stride(),
        v_strides=p.v.stride(),
        q2_strides=q2.stride(),
        k2_strides=k2.stride(),
        o_strides=o4.stride(),
        lam_stride=lam_st,
        cos_strides=cos.stride() if rope else (0, 0, 0, 0),
        sin_strides=sin.stride() if rope else (0, 0, 0, 0),
        H=H,
        D=D,
        R=R,
        BLOCK_M=bm,
        BLOCK_N=bn,
        STEP_M=step,
        MMA_SYNC=mma_sync,
        SPLIT_PV=split_pv,
        DIFF=diff,
        LAM_PTR=p.lam_tensor is not None,
        Q_NORM=q_flags,
        K_NORM=k_flags,
        ROPE=RopeFlags(
            on=rope,
            interleaved=bool(rope and qk.interleaved),
            table_half=bool(rope and qk.table_half),
        ),
        OFF64=not _fits_int32(p, o4, max(bm, bn)),
        TOKEN_MAJOR=token_major,
        PREC=p.dot_prec,
    )
    # No fp contraction: the prologue rounds as eager PyTorch (and qk_norm_rope) does, and
    # an AOT package (lam, scale bound as constants) must compute what this build does (with
    # contraction on, LLVM fused another product once ``lam * x`` folded at lam = 1.0:
    # docs/design/attention.md). The output's one fma is explicit (tl.fma).
    with mma_sync_only(mma_sync):  # where the launch compiles its kernel
        fastpath.launch(
            _swa_fwd_kernel,
            grid,
            args,
            dict(
                kwargs,
                num_warps=st.num_warps,
                num_stages=st.num_stages,
                enable_fp_fusion=False,
                **cap,
            ),
        )


#: Hopper (sm_90): the launches of SAME-L's differential entries run Gluon kernels, a compiled
#: launch on an sm_90 GPU only (:func:`_gluon_device`); everywhere else the Triton kernel
#: (why and how fast: docs/design/attention.md)
_GLUON_ENTRIES = {
    torch.bfloat16: SAME_L_16BIT,
    torch.float16: SAME_L_16BIT,
    torch.float32: SAME_L_FP32,
}
_CAPABILITY: dict = {}


def _sm90(device) -> bool:
    """``device`` (a CUDA one) is an sm_90 GPU: asked once a device, and under torch.compile
    a constant of the trace (the 8-bit front door routes on it while tracing)."""
    return _sm90_index(device.index if device.index is not None else torch.cuda.current_device())


@torch.compiler.assume_constant_result
def _sm90_index(i: int) -> bool:
    if i not in _CAPABILITY:
        _CAPABILITY[i] = torch.cuda.get_device_capability(i)
    return _CAPABILITY[i][0] == 9


def _rows_16b(t: Tensor) -> bool:
    """Channels contiguous, base and every stride 16-byte aligned (a TMA descriptor's
    terms: strides in multiples of 4 fp32 elements; stricter for 16-bit elements, multiples
    of 16)."""
    unit = 4 if t.element_size() == 4 else 16
    return (
        t.stride(3) == 1 and t.data_ptr() % 16 == 0 and all(st % unit == 0 for st in t.stride()[:3])
    )


def gluon_ok(p: Plan, o4: Tensor, st: Settings) -> bool:
    """Whether the launch of ``p`` with the table's settings ``st`` runs a Gluon kernel:
    sm_90 (not the interpreter), differential, head_dim 64, no prologue, both sides of the
    band bounded, every operand and the output with contiguous channels and 16-byte aligned
    rows, and either bf16 / fp16 at the table's SAME-L 16-bit entry (64 / 32-key tiles, 4
    warps: :mod:`ditfuse.kernels.attention_sm90`, the same bits) or fp32 at its fp32 entry
    (32 / 16-key tiles on 2 warps, split P @ V: :mod:`ditfuse.kernels.attention_sm90_fp32`,
    64 / 32-key tf32 wgmma tiles)."""
    if not (
        p.differential
        and p.qk is None
        and p.q.shape[3] == 64
        and p.dot_prec == "tf32"
        and p.left >= 0
        and p.right >= 0
    ):
        return False
    entry = _GLUON_ENTRIES.get(p.q.dtype)
    return (
        entry is not None
        and st.is_entry(entry)
        and all(_rows_16b(t) for t in (p.q, p.k, p.v, p.q2, p.k2, o4))
        and _gluon_device(o4)
    )


def _gluon_device(o4: Tensor) -> bool:
    """A compiled (not interpreted) launch on an sm_90 GPU."""
    return not backend.INTERPRET and o4.device.type == "cuda" and _sm90(o4.device)


def _grid(BH: int, N: int, step: int, token_major: bool):
    """The launch grid of ``step``-query tiles over ``BH`` (batch, head) pairs, and the order
    it takes: token-major unless the tiles overflow a grid's second axis (65535)."""
    n_m = -(-N // step)
    if token_major and n_m > 65535:
        token_major = False
    if not token_major and BH > 65535:
        raise ValueError(
            f"batch x heads = {BH} exceeds 65535 (a CUDA grid axis) with "
            f"{N} tokens; split the batch"
        )
    return ((BH, n_m) if token_major else (n_m, BH)), token_major


def _launch_gluon(p: Plan, o4: Tensor, left: int, right: int, step: int, token_major: bool) -> None:
    """The Gluon kernel of ``p``'s dtype: the 16-bit one on the Triton entry's tiles and
    ``step``; the fp32 one on its own (64 queries storing :func:`query_step`'s, 32-key)."""
    from ditfuse.kernels import attention_sm90 as ag

    B, N, H, D = p.q.shape
    if p.q.dtype == torch.float32:
        from ditfuse.kernels import attention_sm90_fp32 as ag

        step = query_step(ag.BLOCK_M, ag.BLOCK_N, left, right)
    grid, token_major = _grid(B * H, N, step, token_major)
    lam_t = p.lam_tensor if p.lam_tensor is not None else p.q
    descs = [
        ag.descriptor(t, rows)
        for t, rows in zip(
            (p.q, p.k, p.v, p.q2, p.k2),
            (ag.BLOCK_M, ag.BLOCK_N, ag.BLOCK_N, ag.BLOCK_M, ag.BLOCK_N),
        )
    ]
    args = (
        *descs,
        o4,
        lam_t,
        p.lam_value,
        p.scale * LOG2E,
        N,
        left,
        right,
        *o4.stride()[:3],
        p.lam_tensor.stride(0) if p.lam_tensor is not None else 0,
    )
    kernel = (
        ag._swa_diff_fp32_sm90_kernel if p.q.dtype == torch.float32 else ag._swa_diff_sm90_kernel
    )
    fastpath.launch(
        kernel,
        grid,
        args,
        dict(
            H=H,
            D=D,
            BLOCK_M=ag.BLOCK_M,
            BLOCK_N=ag.BLOCK_N,
            STEP_M=step,
            TRIPS=ag.max_trips(N, left, right, step),
            LAM_PTR=p.lam_tensor is not None,
            TOKEN_MAJOR=token_major,
            num_warps=ag.NUM_WARPS,
            maxnreg=ag.MAXNREG,
            enable_fp_fusion=False,
        ),
    )


def _new_out(shape, dtype, device) -> Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


def prologue_apart(D: int, left: int, right: int, differential: bool, prologue: bool) -> bool:
    """Whether the QK-norm + RoPE prologue runs as ``qk_norm_rope`` into scratch before a
    prologue-free attention launch instead of fused into the attention kernel.

    Apart at head_dim 64, differential, a narrow band (SAME-L): the fused kernel normalises
    and rotates every K tile once per query tile that visits it (about twice at SAME's
    window), with DyT's tanh and three dots a score, and measured slower than
    ``qk_norm_rope`` into scratch plus the prologue-free attention (the same bits at the
    same attention settings). Apart at head_dim 128 differential for correctness: the fused
    sm_90 build of that launch shape (8 warps, 16-key tiles) returned wrong results on the
    GPU with a norm and a partial rotary width together (the interpreter is right
    everywhere). Elsewhere fused (not measured apart). The measurements and the failing
    cases: docs/design/attention.md.

    A call with explicit launch settings (``run(p, settings)``) and :func:`launch` itself
    keep the prologue fused."""
    if not prologue:
        return False
    D = tile_dim(D)
    if D >= 128 and differential:
        return True
    span = (left if left >= 0 else 1 << 30) + (right if right >= 0 else 1 << 30) + 1
    return differential and D == 64 and span <= 64


def prologue_scratch(q: Tensor, layout: str, differential: bool) -> tuple:
    """Scratch for the prologue's output where it runs apart: normalised, rotated Q and K
    (and Q2, K2) as (B, N, H, D) views in the activation dtype; every element written. In the
    differential form Q2's heads follow Q's in one (B, N, 2, H, D) buffer (K2's K's), so
    that one ``qk_norm_rope`` pass can write both (:func:`_apart`)."""
    B, N, H, D = q.shape if layout == "bshd" else (q.shape[0], q.shape[2], q.shape[1], q.shape[3])
    if differential:
        sq, sk = (torch.empty(B, N, 2, H, D, dtype=q.dtype, device=q.device) for _ in range(2))
        return sq[:, :, 0], sk[:, :, 0], sq[:, :, 1], sk[:, :, 1]
    return tuple(torch.empty(B, N, H, D, dtype=q.dtype, device=q.device) for _ in range(2))


def _follows(a: Tensor, b: Tensor) -> bool:
    """Whether (B, N, H, D) view ``b`` holds the heads H .. 2H-1 of the (B, N, 2H, D) view
    with ``a``'s strides (so one view covers both)."""
    H = a.shape[2]
    return (
        a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
        and a.device == b.device
        and H > 0
        and b.data_ptr() == a.data_ptr() + H * a.stride(2) * a.element_size()
    )


def _both(a: Tensor) -> Tensor:
    """The (B, N, 2H, D) view of ``a`` and the tensor that follows it (:func:`_follows`)."""
    B, N, H, D = a.shape
    return a.as_strided((B, N, 2 * H, D), a.stride())


def _joint_plan(p: Plan, scratch: tuple):
    """One qk_norm_rope plan over Q's and Q2's heads (K's and K2's) with both outputs, or
    None where the two passes cannot be one: per-head norms (not across heads), tables
    shared by the heads, and every pair laid out as :func:`_follows` says (SAME's packed
    ``to_qkv`` chunks: [q1 | q2 | k1 | k2 | v])."""
    qk = p.qk
    if not p.differential or qk.table_per_head or qk.positions is not None:
        return None
    # a pass that would take the flat-row kernel (one head a token: its per-head norm spans
    # the token) stays two: the per-token kernel of the joint pass may sum in another order
    if qk_ops.flat_applies(qk, scratch[0], scratch[1]):
        return None
    if any(n is not None and n.span_all for n in (qk.q_norm, qk.k_norm)):
        return None
    if qk.cos is not None and (qk.cos.stride(2) or qk.sin.stride(2)):
        return None
    pairs = ((qk.q, p.q2), (qk.k, p.k2), (scratch[0], scratch[2]), (scratch[1], scratch[3]))
    if not all(_follows(a, b) for a, b in pairs):
        return None
    tables = {}
    if qk.cos is not None:
        H = qk.q.shape[2]
        tables = {
            n: t.as_strided((t.shape[0], t.shape[1], 2 * H, t.shape[3]), t.stride())
            for n, t in (("cos", qk.cos), ("sin", qk.sin))
        }
    return dataclasses.replace(qk, q=_both(qk.q), k=_both(qk.k), **tables)


def _apart(p: Plan, scratch: tuple) -> Plan:
    """Run the prologue into ``scratch`` (qk_norm_rope's launcher: its kernels, its bits) and
    return the plan of the attention that reads it. Differential: one pass over Q / Q2 and
    K / K2 together where they lie head after head (:func:`_joint_plan`; per-head norms and
    a shared table give each head the arithmetic of its own pass), else two."""
    qkr = qk_ops
    joint = _joint_plan(p, scratch)
    if joint is not None:
        qkr.launch(joint, _both(scratch[0]), _both(scratch[1]))
    else:
        qkr.launch(p.qk, scratch[0], scratch[1])
        if p.differential:
            qkr.launch(dataclasses.replace(p.qk, q=p.q2, k=p.k2), scratch[2], scratch[3])
    q2 = k2 = None
    if p.differential:
        q2, k2 = scratch[2], scratch[3]
    return dataclasses.replace(p, q=scratch[0], k=scratch[1], q2=q2, k2=k2, qk=None)


def run(p: Plan, settings=None, scratch: Optional[tuple] = None) -> Tensor:
    """Allocate the output (contiguous, in the caller's layout) and compute it. Where the
    prologue runs apart (:func:`prologue_apart`) it writes ``scratch`` (from
    :func:`prologue_scratch`; allocated here if not given)."""
    B, N, H, D = p.q.shape
    shape = (B, N, H, D) if p.layout == "bshd" else (B, H, N, D)
    out = _new_out(shape, p.q.dtype, p.q.device)
    o4 = out if p.layout == "bshd" else out.transpose(1, 2)
    if backend.kernel_device_ok(p.q):
        if (
            p.qk is not None
            and settings is None
            and prologue_apart(D, p.left, p.right, p.differential, True)
        ):
            if scratch is None:
                scratch = prologue_scratch(p.q, "bshd", p.differential)
            p = _apart(p, scratch)
        launch(p, o4, settings)
    else:
        o4.copy_(sliding_window_attention_core(p, torch.float32))
    return out


def _check_grad(*ts):
    if torch.is_grad_enabled() and any(needs_grad(t) for t in ts):
        raise RuntimeError(
            "ditfuse.sliding_window_attention is inference-only (no backward): "
            "call it under torch.no_grad() or torch.inference_mode()"
        )


def sliding_window_attention(
    q,
    k,
    v,
    window,
    *,
    q2=None,
    k2=None,
    lam=1.0,
    scale=None,
    layout="bshd",
    q_norm=None,
    k_norm=None,
    cos=None,
    sin=None,
    rope_style="half",
    rotary_dim=None,
    precision=None,
):
    r"""Attention restricted to a band of keys around each query, optionally differential,
    optionally with the QK-norm + RoPE prologue fused in.

    .. math::

        \mathrm{Attn}(Q, K, V)_i = \sum_{j \in W(i)}
            \frac{e^{s\, q_i \cdot k_j}}{\sum_{j' \in W(i)} e^{s\, q_i \cdot k_{j'}}} v_j,
        \qquad W(i) = \{\, j : i - \ell \le j \le i + r,\ 0 \le j < N \,\}

        \mathrm{out} = \mathrm{Attn}(Q, K, V)
            \;\big[\, - \lambda_h\, \mathrm{Attn}(Q_2, K_2, V) \,\big]

    with :math:`s` = ``scale``. It equals SDPA with the dense additive band mask (SAME's
    ``_band_mask``) but visits only the key tiles that intersect the band: O(N (l + r))
    work and no (N, N) mask. The differential form (Stable Audio 3 / SAME:
    ``to_qkv(x).chunk(5)`` = q1, q2, k1, k2, v) is one kernel that reads each V tile once.

    Parameters
    ----------
    q, k, v : Tensor
        ``(B, N, H, D)`` (``layout="bshd"``) or ``(B, H, N, D)`` (``"bhsd"``); fp16, bf16 or
        fp32, one dtype and device; ``D`` up to 128 (32, 64 and 128 fill the tiles; other
        head dims run on tiles padded to the next power of two). Any strides: the chunks of a
        packed projection, ``to_qkv(x).chunk(5, -1)[i].unflatten(-1, (H, D))``, are read in
        place with no copy.
    window : int or (int, int)
        ``w``: keys with ``|i - j| <= w`` (SAME's ``_band_mask(N, w)``). ``(left, right)``:
        keys ``i - left <= j <= i + right`` (FlashAttention's ``window_size``); ``-1`` on a
        side is unbounded, so ``(-1, 0)`` is causal and ``(-1, -1)`` (or ``-1``) full
        attention.
    q2, k2 : Tensor, optional
        The second query/key of differential attention (shape, dtype of ``q``); both or
        neither.
    lam : float or Tensor
        :math:`\lambda`: a float, or a per-head tensor ``(H,)`` (or one element) of any float
        dtype, read on the device. Only with ``q2``/``k2``.
    scale : float, optional
        Softmax scale, default ``1 / sqrt(D)``.
    layout : {"bshd", "bhsd"}
        How the 4-D inputs (and the output) are laid out.
    q_norm, k_norm : module or NormSpec, optional
        Per-head norm of the Q (and Q2) / K (and K2) tiles as they load: SAME's
        ``DynamicTanh``, ``torch.nn.RMSNorm(D)``, LayerNorm, diffusers' ``RMSNorm``,
        ``StableAudio3RMSNorm`` or a :class:`ditfuse.NormSpec` (weights of ``D`` elements).
    cos, sin : Tensor, optional
        RoPE tables applied to the Q/K tiles after the norm, as :func:`ditfuse.qk_norm_rope`
        takes them: ``(N, W)``, ``(B, N, W)``, ``(1|B, N, 1|H, W)``; ``W`` = ``rotary_dim``
        (cat-duplicated for ``"half"``, as SAME builds ``freqs.cos()`` of
        ``cat((freqs, freqs), -1)``; repeat-interleaved for ``"interleaved"``) or half of it.
    rope_style : {"half", "interleaved"}
        Rotate-half pairs ``(i, i + r/2)`` (SAME, Stable Audio) or ``(2i, 2i + 1)``.
    rotary_dim : int, optional
        Channels that rotate (the first ``rotary_dim``; SAME-L: 32 of 64); as in
        :func:`ditfuse.qk_norm_rope` (required when the table is ``D/2`` wide).
    precision : {"highest", "high", "medium"}, optional
        How fp32 inputs multiply, in PyTorch's terms; None (default) follows
        ``torch.get_float32_matmul_precision()`` at the call, as ``torch.matmul`` does.
        ``"highest"`` (PyTorch's default): fp32-accurate products (each operand split into
        two tf32 terms, three tensor-core products); ``"high"`` / ``"medium"``: one tf32
        product (faster; on sm_90 SAME-L's differential entry runs the Gluon kernel). No
        effect on 16-bit inputs.

    Returns
    -------
    Tensor
        ``(B, N, H, D)`` (``"bhsd"``: ``(B, H, N, D)``), contiguous, in the input dtype.

    Notes
    -----
    Numerical contract. Both products run on tensor cores with fp32 accumulation; the
    softmax (running max and sum, exp2 of log2(e)-scaled scores) is fp32; the output is
    ``acc * (1 / l)`` (minus ``acc2 * (lam * (1 / l2))``) in fp32, rounded once to the input
    dtype.
    Against an fp64 evaluation of the dense-mask formula on the same inputs, with
    ``scale_i = |ref_i| + (1 + |lam|) rms(v)`` (the output is a convex combination of V
    rows, one per map), ``|out - ref| <= ACCURACY[dtype] * scale``:

    * bf16 / fp16 (``2^-7`` / ``2^-10``): the output's rounding plus the probabilities
      rounded to the input dtype before ``P @ V`` (as FlashAttention does); Q, K, V are
      used as given. Measured: <= 5.2e-3 / 6.5e-4.
    * fp32 at ``precision="highest"`` (``ACCURACY_HIGHEST``, ``2^-16``): products as
      accurate as fp32's (the tf32 split leaves ~2^-21 of each operand); with window 0 the
      output is V to fp32 rounding.
    * fp32 at ``"high"`` / ``"medium"`` (``2^-8``): tf32 tensor-core operands (10 mantissa
      bits; the GPU drops the low 13 bits of each operand). About 1e-3 relative for logits
      of order one (measured <= 1.4e-3); a logit's error is bounded by
      ``2^-9 * scale * sum_d |q_d k_d|``, so it grows with the logits' magnitude (~1e-2 at
      logits of ~10).
    * Differential: one rounding of the difference; diffusers' eager code rounds each
      map and then the difference, so the fused result is nearer the exact value. On
      sm_90, bf16 / fp16 at head_dim 64 in a narrow band without the prologue (SAME-L)
      runs a Gluon kernel (:func:`gluon_ok`) bitwise equal to the Triton kernel it
      replaces: the same tiles and arithmetic, only the waits on the tensor cores moved.
    * Prologue: the arithmetic of :func:`ditfuse.qk_norm_rope` (fp32, rounded to the
      activation dtype after the norm and after the rotation, no fused multiply-add), so
      the tiles fed to the tensor cores are those ``qk_norm_rope`` would write (bitwise
      for DyT and RoPE; RMS/LayerNorm statistics may differ in reduction order in the
      last fp32 bit). Where it measured faster (:func:`prologue_apart`: head_dim 64,
      differential, a window of at most 64 keys -- SAME-L), and at head_dim 128 with the
      differential form (the fused build gave wrong results there on the GPU), it runs as
      ``qk_norm_rope`` into scratch (Q and K, and Q2 and K2: (B, N, H, D) views of the
      activation dtype; one pass over both pairs where Q2 / K2 lie head after head behind
      Q / K, as in SAME's packed projection) and the attention kernel reads that: the same
      tiles (at head_dim 64 the same bits as the fused kernel at the same launch settings on
      the GPU). Against SAME's bf16 eager chain (DyT rounded after each of its four steps)
      the output is within four roundings.

    Inference only (no autograd). Rows never see an empty band (the diagonal is always in
    it). Bad input raises ``ValueError`` / ``TypeError`` naming the argument before any
    kernel runs; there are no hidden copies. A repeat call whose signature (every tensor's
    shape, strides, dtype, device and alignment; every scalar, the norms' included) passed
    the checks before replays that call's recorded launch with its own tensors: the same
    kernel and arguments, so the same bits.

    Examples
    --------
    >>> with torch.no_grad():
    ...     q1, q2, k1, k2, v = (t.unflatten(-1, (24, 64)) for t in attn.to_qkv(x).chunk(5, -1))
    ...     freqs = attn.rope(N, x.device)                       # SAME: (N, 32)
    ...     out = ditfuse.sliding_window_attention(
    ...         q1, k1, v, 17, q2=q2, k2=k2, q_norm=attn.q_norm, k_norm=attn.k_norm,
    ...         cos=freqs.cos(), sin=freqs.sin(), rotary_dim=32)  # (B, N, 24, 64)
    """
    _check_grad(q, k, v, q2, k2, lam, q_norm, k_norm, cos, sin)
    o = Options(
        q2, k2, lam, scale, layout, q_norm, k_norm, cos, sin, rope_style, rotary_dim, precision
    )
    if torch.compiler.is_compiling():
        return _via_op(q, k, v, window, o)
    key = None
    if fastpath.usable(q):
        try:
            key, slots = _fast_key(q, k, v, window, o)
            replay = _CACHE.get(key)
        except (AttributeError, TypeError, ValueError):  # the checks below explain
            key = replay = None
        if replay is not None:
            out = _new_out(q.shape, q.dtype, q.device)  # q's shape in the caller's layout
            scratch = _call_scratch(q, window, q2, layout, q_norm, k_norm, cos)
            if replay(slots + (out,) + scratch):
                return out
    p = plan(q, k, v, window, **o._asdict())
    if key is None:  # (a key implies a device the kernel runs on: fastpath.usable)
        return run(p)
    scratch = _call_scratch(q, window, q2, layout, q_norm, k_norm, cos)
    with fastpath.Recorder() as rec:
        out = run(p, scratch=scratch)
    _CACHE.put(key, rec.replay(slots + (out,) + scratch))
    return out


def _call_scratch(q, window, q2, layout, q_norm, k_norm, cos) -> tuple:
    """The prologue's scratch of a call whose arguments passed the checks (a recorded
    signature): empty unless the prologue runs apart."""
    left, right = parse_window(window)
    prologue = q_norm is not None or k_norm is not None or cos is not None
    if not prologue_apart(q.shape[-1], left, right, q2 is not None, prologue):
        return ()
    return prologue_scratch(q, layout, q2 is not None)


_CACHE = fastpath.Cache()


def _fast_key(q, k, v, window, o: Options):
    """The signature of an eager call (every tensor's shape, strides, dtype, device and
    alignment; every scalar the launch takes, the norms' included; the launch table) and
    its tensors in replay-slot order. Raises TypeError / ValueError / AttributeError where
    an argument is not what the checks accept (they then run and say why)."""
    q2, k2, lam, scale, layout, q_norm, k_norm, cos, sin, rope_style, rotary_dim, precision = o
    sig = fastpath.sig
    qn = flatten_norm(q_norm, "q_norm")
    kn = flatten_norm(k_norm, "k_norm")
    lam_t = lam if isinstance(lam, Tensor) else None
    if lam_t is None and (isinstance(lam, bool) or not isinstance(lam, (int, float))):
        raise TypeError("lam")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError("scale")
    win = window if isinstance(window, int) else tuple(window)
    tensors = (q, k, v, q2, k2, lam_t, *qn[:3], *kn[:3], cos, sin)
    # whether Q2 / K2 lie head after head behind Q / K (one prologue pass over both,
    # _joint_plan): a relation between tensors that their own signatures do not hold; only
    # a call with a prologue can take that pass, so plain calls skip the test
    prologue = q_norm is not None or k_norm is not None or cos is not None
    joint = (
        prologue
        and all(isinstance(t, Tensor) and t.dim() == 4 for t in (q, k, q2, k2))
        and all(
            _follows(*((a, b) if layout == "bshd" else (a.transpose(1, 2), b.transpose(1, 2))))
            for a, b in ((q, q2), (k, k2))
        )
    )
    key = (
        win,
        None if lam_t is not None else float(lam),
        None if scale is None else float(scale),
        layout,
        rope_style,
        rotary_dim,
        qn[3:],
        kn[3:],
        launch_settings,
        joint,
        dot_precision(q.dtype, precision),
        *(sig(t) for t in tensors),
    )
    hash(key)
    return key, tensors


# ---------------------------------------------------------------------------------------
# torch.library op (used under torch.compile; eager calls launch directly)


def _op_plan(q, k, v, q2, k2, lam_t, lam, left, right, scale, layout, *rest) -> Plan:
    """The plan of the op's flattened arguments (:func:`op_args`; the op's and its fake's):
    after ``layout`` each norm's eight fields (``flatten_norm``), then cos, sin,
    rope_style, rotary_dim (0: all of D) and precision."""
    cos, sin, rope_style, rotary_dim, precision = rest[16:]
    lam = lam_t if lam_t is not None else lam
    q_norm, k_norm = unflatten_norm(*rest[:8]), unflatten_norm(*rest[8:16])
    r = rotary_dim or None
    o = Options(q2, k2, lam, scale, layout, q_norm, k_norm, cos, sin, rope_style, r, precision)
    return plan(q, k, v, (left, right), **o._asdict())


@library.op("ditfuse::sliding_window_attention", mutates_args=())
def sliding_window_attention_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q2: Optional[Tensor],
    k2: Optional[Tensor],
    lam_t: Optional[Tensor],
    lam: float,
    left: int,
    right: int,
    scale: Optional[float],
    layout: str,
    q_weight: Optional[Tensor],
    q_bias: Optional[Tensor],
    q_alpha_t: Optional[Tensor],
    q_kind: int,
    q_eps: float,
    q_size: int,
    q_alpha: float,
    q_pre: bool,
    k_weight: Optional[Tensor],
    k_bias: Optional[Tensor],
    k_alpha_t: Optional[Tensor],
    k_kind: int,
    k_eps: float,
    k_size: int,
    k_alpha: float,
    k_pre: bool,
    cos: Optional[Tensor],
    sin: Optional[Tensor],
    rope_style: str,
    rotary_dim: int,
    precision: str,
) -> Tensor:
    return run(
        _op_plan(
            q,
            k,
            v,
            q2,
            k2,
            lam_t,
            lam,
            left,
            right,
            scale,
            layout,
            q_weight,
            q_bias,
            q_alpha_t,
            q_kind,
            q_eps,
            q_size,
            q_alpha,
            q_pre,
            k_weight,
            k_bias,
            k_alpha_t,
            k_kind,
            k_eps,
            k_size,
            k_alpha,
            k_pre,
            cos,
            sin,
            rope_style,
            rotary_dim,
            precision,
        )
    )


@sliding_window_attention_op.register_fake
def _(*args):
    p = _op_plan(*args)
    B, N, H, D = p.q.shape
    shape = (B, N, H, D) if p.layout == "bshd" else (B, H, N, D)
    return torch.empty(shape, dtype=p.q.dtype, device=p.q.device)


def op_args(q, k, v, window, **options):
    """The arguments of ``torch.ops.ditfuse.sliding_window_attention`` for a public call
    (``options``: the fields of :class:`Options`)."""
    return _op_args(q, k, v, window, Options(**options))


def _op_args(q, k, v, window, o: Options):
    """:func:`op_args` of the call's :class:`Options` (``precision`` resolved here: the
    setting when the call is traced)."""
    q2, k2, lam, scale, layout, q_norm, k_norm, cos, sin, rope_style, rotary_dim, precision = o
    left, right = parse_window(window)
    lam_t = lam if isinstance(lam, Tensor) else None
    if lam_t is None and (isinstance(lam, bool) or not isinstance(lam, (int, float))):
        raise TypeError(f"lam must be a finite float or a per-head tensor, got {lam!r}")
    lam_v = 1.0 if lam_t is not None else float(lam)
    if scale is not None and not isinstance(scale, bool) and isinstance(scale, (int, float)):
        scale = float(scale)
    return (
        q,
        k,
        v,
        q2,
        k2,
        lam_t,
        lam_v,
        left,
        right,
        scale,
        layout,
        *flatten_norm(q_norm, "q_norm"),
        *flatten_norm(k_norm, "k_norm"),
        cos,
        sin,
        rope_style,
        int(rotary_dim or 0),
        _matmul_precision() if precision is None else precision,
    )


def _via_op(q, k, v, window, o: Options):
    return torch.ops.ditfuse.sliding_window_attention(*_op_args(q, k, v, window, o))


def sliding_window_attention_reference(q, k, v, window, *, compute_dtype=torch.float32, **kwargs):
    """Pure-PyTorch :func:`ditfuse.sliding_window_attention` (same arguments): SDPA with a
    dense (N, N) band mask. Output in the caller's layout, contiguous."""
    p = plan(q, k, v, window, **kwargs)
    out = sliding_window_attention_core(p, compute_dtype)
    return out if p.layout == "bshd" else out.transpose(1, 2).contiguous()
