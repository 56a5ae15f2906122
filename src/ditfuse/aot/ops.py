"""The export registry: which ops can be packaged, with which tensors, and how to call them.

An entry says, for one op:

* the runtime tensors in TensorRT's order (inputs, then outputs), each with a symbolic
  shape over ``B`` (batch) and ``N`` (tokens) and a dtype, all contiguous;
* which of them carry the symbols, and which symbols are INT32 extras (``N``);
* ``call``: the op's *public* function applied to those tensors. The exporter calls it on
  meta tensors with the kernel launch intercepted, so the launch settings, constexprs and
  strides of the package are exactly those of the JIT call (nothing is restated here);
* ``writes``: the kernel parameters stored to, and the output each one is;
* ``grid``: the launch grid as a formula of the symbols, checked against the captured grids.

Adding an op is one :class:`OpExport` in :data:`REGISTRY`.

``sliding_window_attention`` (registered when ``ditfuse.attention`` is present) has SAME-L's
differential attention as its example; it is a tensor-core kernel (``tensor_cores=True``),
so a package whose PTX has no ``mma`` / ``wgmma`` is refused.
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

_DTYPES = ("bf16", "fp16", "fp32")


@dataclass(frozen=True)
class Opt:
    """An op-specific export option (``--heads 40``)."""

    name: str
    type: type
    default: Any
    help: str = ""
    choices: Optional[Sequence] = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class TensorSpec:
    """A runtime tensor: ``kind`` input/output, shape over ints and the symbols B / N."""

    name: str
    kind: str
    shape: Tuple
    dtype: str
    aliases: Optional[str] = None  # an output that is this input's memory (in place)
    doc: str = ""


@dataclass(frozen=True)
class OpExport:
    op: str
    summary: str
    kernel: str  # "module:attr" of the @triton.jit kernel
    options: Tuple[Opt, ...]
    tensors: Callable[[Any], List[TensorSpec]]  # opts -> runtime tensors, in runtime order
    call: Callable[[Any, Dict], None]  # opts, tensors -> the public call
    writes: Dict[str, str]  # kernel param -> output name
    grid: Callable[[Any, Any], Tuple[str, str, str]]  # opts, a Capture -> grid formulas
    tag: Callable[[Any], str]  # the specialization in whole words (export's
    #                                              entry_name shortens a long one safely)
    lookups: Tuple[str, ...] = ()  # where launchers find the kernel ("module:attr")
    extras: Tuple[str, ...] = ("N",)  # symbols passed as INT32 extras, in order
    tensor_cores: bool = False  # must contain mma / wgmma
    example_n: int = 75600  # token count of the captured calls
    default_target: str = "sm_90"
    same_float_ops: bool = True  # refuse a float-op histogram unlike the JIT's
    float_ops_note: str = ""  # why they may differ (same_float_ops=False)
    # None: the JIT call's; or (opts, the JIT call's kwargs) -> stages or None
    default_num_stages: Union[None, int, Callable[[Any, Dict], Optional[int]]] = None
    stages_note: str = ""  # the --num-stages help's word on the default
    contract: str = ""
    kernel_for: Optional[Callable[[Any], str]] = None  # opts -> "module:attr" where the public
    #                                                    call picks the kernel by its options

    def defaults(self) -> argparse.Namespace:
        return argparse.Namespace(**{o.name: o.default for o in self.options})

    def resolve(self, **options) -> argparse.Namespace:
        ns = self.defaults()
        for k, v in options.items():
            if v is None:
                continue
            opt = next((o for o in self.options if o.name == k), None)
            if opt is None:
                raise TypeError(
                    f"{self.op}: unknown option {k!r}; options: "
                    f"{', '.join(o.name for o in self.options)}"
                )
            v = opt.type(v)
            if opt.choices is not None and v not in opt.choices:
                raise ValueError(f"{self.op}: {k} must be one of {tuple(opt.choices)}, got {v!r}")
            setattr(ns, k, v)
        return ns


def _choice(name: str, choices: Tuple[str, ...], help: str) -> Opt:
    """A string option taking one of ``choices``, the first by default."""
    return Opt(name, str, choices[0], help, choices)


def _torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


# ---------------------------------------------------------------------------------------
# qk_norm_rope: Wan's packed QKV, in place


def _qk_tensors(o) -> List[TensorSpec]:
    HD = o.heads * o.head_dim
    span = HD if o.norm_span == "all" else o.head_dim
    return [
        TensorSpec(
            "qkv",
            "input",
            ("B", "N", 3 * HD),
            o.dtype,
            doc="packed [q | k | v] projection; q and k are normalised and rotated in "
            "place, v is not touched",
        ),
        TensorSpec(
            "cos",
            "input",
            (1, "N", 1, o.head_dim),
            o.table_dtype,
            doc="rotary cos table, one row per token (repeat-interleaved or "
            "cat-duplicated, as diffusers builds it)",
        ),
        TensorSpec("sin", "input", (1, "N", 1, o.head_dim), o.table_dtype, doc="rotary sin table"),
        TensorSpec("q_weight", "input", (span,), o.dtype, doc="norm_q.weight"),
        TensorSpec("k_weight", "input", (span,), o.dtype, doc="norm_k.weight"),
        TensorSpec(
            "qkv_out",
            "output",
            ("B", "N", 3 * HD),
            o.dtype,
            aliases="qkv",
            doc="qkv itself (in place)",
        ),
    ]


def _qk_call(o, t: Dict) -> None:
    from ditfuse.norms import NormSpec
    from ditfuse.ops.qk_norm_rope import qk_norm_rope

    HD = o.heads * o.head_dim
    qkv = t["qkv_out"] if "qkv_out" in t else t["qkv"]
    if qkv.data_ptr() != t["qkv"].data_ptr():
        qkv.copy_(t["qkv"])
    span = HD if o.norm_span == "all" else o.head_dim
    qn = NormSpec("rms", weight=t["q_weight"], eps=o.eps, size=span)
    kn = NormSpec("rms", weight=t["k_weight"], eps=o.eps, size=span)
    qk_norm_rope(
        qkv[..., :HD],
        qkv[..., HD : 2 * HD],
        t["cos"],
        t["sin"],
        q_norm=qn,
        k_norm=kn,
        num_heads=o.heads,
        rope_style=o.rope,
        inplace=True,
    )


def _qk_kernel_for(o) -> str:
    """The kernel qk_norm_rope launches for these options, as its launcher decides
    (``flat_applies`` on the plan of a small meta call): the flat-row kernel or the
    per-token one."""
    import importlib

    import torch

    from ditfuse.norms import NormSpec

    qkr = importlib.import_module("ditfuse.ops.qk_norm_rope")
    HD, dt = o.heads * o.head_dim, _torch_dtype(o.dtype)
    qkv = torch.empty(1, 2, 3 * HD, dtype=dt, device="meta")
    tab = torch.empty(1, 2, 1, o.head_dim, dtype=_torch_dtype(o.table_dtype), device="meta")
    span = HD if o.norm_span == "all" else o.head_dim
    norm = NormSpec("rms", weight=torch.empty(span, dtype=dt, device="meta"), eps=o.eps, size=span)
    p = qkr.plan(
        qkv[..., :HD],
        qkv[..., HD : 2 * HD],
        tab,
        tab,
        q_norm=norm,
        k_norm=norm,
        num_heads=o.heads,
        rope_style=o.rope,
        runtime_checks=False,
    )
    if qkr.flat_applies(p, p.q, p.k):
        return "ditfuse.kernels.qk_flat:_qk_norm_rope_flat_kernel"
    return "ditfuse.kernels.qk_token:_qk_norm_rope_kernel"


QK_NORM_ROPE = OpExport(
    op="qk_norm_rope",
    summary="fused QK RMSNorm + RoPE on a packed QKV projection, in place (default: Wan 14B, "
    "RMSNorm across 40 heads x 128 with weight, interleaved RoPE, bf16, fp32 "
    "(1, N, 1, 128) table)",
    kernel="ditfuse.kernels.qk_token:_qk_norm_rope_kernel",
    options=(
        Opt("heads", int, 40, "attention heads H"),
        Opt("head_dim", int, 128, "head dimension D"),
        Opt("dtype", str, "bf16", "activation (and norm weight) dtype", _DTYPES),
        Opt("table_dtype", str, "fp32", "cos/sin table dtype", _DTYPES),
        Opt("eps", float, 1e-6, "RMSNorm epsilon"),
        _choice(
            "norm_span", ("all", "head"), "RMSNorm across all heads of a token (Wan) or per head"
        ),
        _choice("rope", ("interleaved", "half"), "RoPE pairs (2i, 2i+1) or rotate-half"),
    ),
    tensors=_qk_tensors,
    call=_qk_call,
    writes={"qo_ptr": "qkv_out", "ko_ptr": "qkv_out"},
    grid=lambda o, c: ("B * N", str(c.grid[1]), "1"),
    tag=lambda o: f"h{o.heads}d{o.head_dim}_{o.dtype}_{o.norm_span}_{o.rope}",
    contract="bitwise equal to ditfuse.qk_norm_rope(qkv[..., :H*D], qkv[..., H*D:2*H*D], cos, "
    "sin, q_norm=RMSNorm, k_norm=RMSNorm, num_heads=H, inplace=True) (the same kernel "
    "body, the same constexprs, with the strides as compile-time constants)",
    kernel_for=_qk_kernel_for,
)


# ---------------------------------------------------------------------------------------
# AdaLN: Wan's fp32 temb chunks


def _mod_chunks(o, t, *names):
    temb = t["temb"]
    return [temb[:, getattr(o, n + "_chunk") : getattr(o, n + "_chunk") + 1] for n in names]


def _rows(o, name: str, kind: str, doc: str) -> TensorSpec:
    """A (B, N, D) tensor of the AdaLN ops, in the activation dtype."""
    return TensorSpec(name, kind, ("B", "N", o.dim), o.dtype, doc=doc)


def _temb(o, doc: str) -> TensorSpec:
    """Wan's fp32 (B, 6, D) modulation, the AdaLN ops' chunks (``doc``: which)."""
    doc = "(scale_shift_table + temb.float()): " + doc
    return TensorSpec("temb", "input", ("B", 6, o.dim), "fp32", doc=doc)


def _adaln_tensors(o) -> List[TensorSpec]:
    return [
        _rows(o, "x", "input", "hidden states"),
        _temb(o, "its .chunk(6, dim=1) views give shift / scale (/ gate)"),
        _rows(o, "out", "output", "norm(x) * (1 + scale) + shift"),
    ]


def _adaln_call(o, t: Dict) -> None:
    from ditfuse.ops.adaln import adaln_modulate

    shift, scale = _mod_chunks(o, t, "shift", "scale")
    adaln_modulate(t["x"], shift, scale, norm=o.norm, eps=o.eps, out=t["out"])


def _gated_tensors(o) -> List[TensorSpec]:
    return _residual_tensors(o, "attention / FFN", "gate / shift / scale chunks") + [
        _rows(o, "out", "output", "norm(x_new) * (1 + scale) + shift"),
    ]


def _gated_call(o, t: Dict) -> None:
    from ditfuse.ops.adaln import gated_residual_adaln

    gate, shift, scale = _mod_chunks(o, t, "gate", "shift", "scale")
    x_new, out = gated_residual_adaln(t["x"], t["y"], gate, shift, scale, norm=o.norm, eps=o.eps)
    # real tensors (the JIT path of the TensorRT plugin): land in the given outputs. The
    # export's capture runs on meta tensors and maps the kernel's output params by `writes`.
    if "x_new" in t and x_new.device.type != "meta":
        t["x_new"].copy_(x_new)
        t["out"].copy_(out)


def _tile_grid(o, c):
    """The tile kernel's grid: (rows of N per program, B) programs."""
    rows = int(c.kwargs["ROWS"])
    return ("N" if rows == 1 else f"cdiv(N, {rows})", "B", "1")


#: An AdaLN export: the three ops launch one tile kernel on one grid; those with a norm
#: name their specialization by width, dtype and norm
_adaln_export = functools.partial(
    OpExport,
    kernel="ditfuse.ops.adaln:_adaln_tile_kernel",
    grid=_tile_grid,
    tag=lambda o: f"d{o.dim}_{o.dtype}_{o.norm}",
)


_ADALN_OPTS = (
    Opt("dim", int, 5120, "model width D"),
    Opt("dtype", str, "bf16", "activation dtype", _DTYPES),
    Opt("eps", float, 1e-6, "norm epsilon"),
    _choice("norm", ("layer", "rms"), "LayerNorm without affine (Wan's FP32LayerNorm) or RMSNorm"),
    Opt("shift_chunk", int, 0, "temb chunk holding shift", range(6)),
    Opt("scale_chunk", int, 1, "temb chunk holding scale", range(6)),
)

ADALN_MODULATE = _adaln_export(
    op="adaln_modulate",
    summary="norm(x) * (1 + scale) + shift with fp32 (B, 1, D) chunk views of temb "
    "(default: Wan 14B, D = 5120, bf16, LayerNorm eps 1e-6)",
    options=_ADALN_OPTS,
    tensors=_adaln_tensors,
    call=_adaln_call,
    writes={"out_ptr": "out"},
    contract="bitwise equal to ditfuse.adaln_modulate(x, temb[:, shift_chunk:+1], "
    "temb[:, scale_chunk:+1], norm=..., eps=...)",
)

GATED_RESIDUAL_ADALN = _adaln_export(
    op="gated_residual_adaln",
    summary="x_new = x + y * gate; out = norm(x_new) * (1 + scale) + shift, fp32 (B, 1, D) "
    "chunk views of temb (default: Wan 14B, D = 5120, bf16)",
    options=_ADALN_OPTS + (Opt("gate_chunk", int, 2, "temb chunk holding gate", range(6)),),
    tensors=_gated_tensors,
    call=_gated_call,
    writes={"xnew_ptr": "x_new", "out_ptr": "out"},
    contract="bitwise equal to ditfuse.gated_residual_adaln(x, y, gate, shift, scale, ...) "
    "with gate / shift / scale the temb chunks",
)


def _residual_tensors(o, branch="Wan: the FFN's", chunks="its gate chunk") -> List[TensorSpec]:
    return [
        _rows(o, "x", "input", "residual stream"),
        _rows(o, "y", "input", f"branch output ({branch})"),
        _temb(o, chunks),
        _rows(o, "x_new", "output", "x + y * gate"),
    ]


def _residual_call(o, t: Dict) -> None:
    from ditfuse.ops import adaln

    (gate,) = _mod_chunks(o, t, "gate")
    # the tile kernel, whose constexprs do not depend on N (the JIT's flat kernel on dense
    # rows specializes on whether N * D fills its blocks); the same bits (tests/test_adaln.py).
    # gated_residual(x, y, gate, out=x_new) with the flat kernel off
    o = adaln._residual_options("once")
    adaln._run(t["x"], t["y"], gate, None, None, o, out=t["x_new"], modulated=False, flat=False)


GATED_RESIDUAL = _adaln_export(
    op="gated_residual",
    summary="x_new = x + y * gate in fp32, stored in x's dtype, gate an fp32 (B, 1, D) chunk "
    "view of temb (default: Wan 14B's FFN residual, D = 5120, bf16, c_gate_msa)",
    options=(
        Opt("dim", int, 5120, "model width D"),
        Opt("dtype", str, "bf16", "activation dtype", _DTYPES),
        Opt("gate_chunk", int, 5, "temb chunk holding gate", range(6)),
    ),
    tensors=_residual_tensors,
    call=_residual_call,
    writes={"xnew_ptr": "x_new"},
    tag=lambda o: f"d{o.dim}_{o.dtype}",
    contract="bitwise equal to ditfuse.gated_residual(x, y, temb[:, gate_chunk:+1]), i.e. "
    "Wan's (x.float() + ff.float() * c_gate_msa).type_as(x)",
)


# ---------------------------------------------------------------------------------------
# sliding-window attention: SAME-L's differential attention


def _swa_tensors(o) -> List[TensorSpec]:
    H, D = o.heads, o.head_dim
    return [
        TensorSpec(
            "q",
            "input",
            ("B", "N", 2 * H, D),
            o.dtype,
            doc="[q1 | q2]: the two queries as blocked halves of 2H heads",
        ),
        TensorSpec("k", "input", ("B", "N", 2 * H, D), o.dtype, doc="[k1 | k2], likewise"),
        TensorSpec("v", "input", ("B", "N", H, D), o.dtype, doc="the shared values"),
        TensorSpec(
            "out",
            "output",
            ("B", "N", H, D),
            o.dtype,
            doc="Attn(q1, k1, v) - lam * Attn(q2, k2, v) over the band |i - j| <= window",
        ),
    ]


def _swa_call(o, t: Dict) -> None:
    from ditfuse.ops.attention import sliding_window_attention

    H = o.heads
    q, k = t["q"], t["k"]
    # the TensorRT contract multiplies fp32 in tf32, whatever this process's matmul precision
    out = sliding_window_attention(
        q[:, :, :H],
        k[:, :, :H],
        t["v"],
        o.window,
        q2=q[:, :, H:],
        k2=k[:, :, H:],
        lam=o.lam,
        precision="high",
    )
    if "out" in t and out.device.type != "meta":  # real tensors (the plugin's JIT path)
        t["out"].copy_(out)


SLIDING_WINDOW_ATTENTION = OpExport(
    op="sliding_window_attention",
    summary="differential sliding-window attention on tensor cores (default: SAME-L, 24 heads "
    "x 64, window 17, fp32 (tf32 math), lambda 1)",
    kernel="ditfuse.kernels.attention:_swa_fwd_kernel",
    options=(
        Opt("heads", int, 24, "heads H of each attention map (q holds 2H)"),
        Opt("head_dim", int, 64, "head dimension D", (32, 64, 128)),
        Opt("window", int, 17, "keys with |i - j| <= window"),
        Opt("dtype", str, "fp32", "activation dtype", _DTYPES),
        Opt("lam", float, 1.0, "lambda of the second map"),
    ),
    tensors=_swa_tensors,
    call=_swa_call,
    writes={"o_ptr": "out"},
    grid=lambda o, c: (
        (f"B * {o.heads}", f"cdiv(N, {c.kwargs['STEP_M']})", "1")
        if c.kwargs["TOKEN_MAJOR"]
        else (f"cdiv(N, {c.kwargs['STEP_M']})", f"B * {o.heads}", "1")
    ),
    tag=lambda o: f"h{o.heads}d{o.head_dim}_w{o.window}_{o.dtype}_diff",
    tensor_cores=True,
    example_n=17 * 1938,
    # sm_90 PTX of this kernel's 64-query tiles uses wgmma (sm_90a only): sm_80 PTX
    # (mma.sync) runs on Hopper and is what a plain-sm_90 runtime (TensorRT) can load. For
    # 64-query tiles one pipeline stage keeps shared memory under 48 KB (the JIT's stages
    # need 56 KB on sm_80); the 32-query two-warp tiles of the fp32 SAME-size entry take the
    # JIT's three stages in 40 KB
    default_target="sm_80",
    default_num_stages=lambda o, jit: 1 if jit["BLOCK_M"] >= 64 else None,
    stages_note="1 for 64-query tiles, the JIT's for the 32-query fp32 tiles",
    same_float_ops=False,
    float_ops_note="lam is a compile-time 1.0 here: the JIT's per-row multiply "
    "lam * (1 / l2) folds away (exact), and with fp contraction off in this "
    "kernel the output's one fma (written in the kernel) takes the same "
    "operands in both builds",
    contract="fp32 products in tf32 (precision='high', the TensorRT contract; the library's "
    "default follows torch.get_float32_matmul_precision()); "
    "bitwise equal to ditfuse.sliding_window_attention(q[:, :, :H], k[:, :, :H], v, "
    "window, q2=q[:, :, H:], k2=k[:, :, H:], lam=lam, precision='high') for N > window (for N <= "
    "window the JIT clamps the window to N, which selects the same keys), run with "
    "the Triton kernel (on sm_90 the JIT routes SAME-L's calls to Gluon kernels: "
    "the same bits in 16-bit, within the fp32 contract in fp32: attention.gluon_ok)",
)


def _have(*modules: str) -> bool:
    import importlib.util

    try:
        return all(importlib.util.find_spec(m) is not None for m in modules)
    except ImportError:
        return False


REGISTRY: Dict[str, OpExport] = {
    e.op: e for e in (QK_NORM_ROPE, ADALN_MODULATE, GATED_RESIDUAL_ADALN, GATED_RESIDUAL)
}
if _have("ditfuse.ops.attention", "ditfuse.kernels.attention"):
    REGISTRY[SLIDING_WINDOW_ATTENTION.op] = SLIDING_WINDOW_ATTENTION


def get(op: str) -> OpExport:
    if op not in REGISTRY:
        raise KeyError(f"no export for {op!r}; exportable ops: {', '.join(REGISTRY)}")
    return REGISTRY[op]
