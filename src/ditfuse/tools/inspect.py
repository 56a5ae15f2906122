"""``ditfuse inspect``: registers, spills, stack and local memory of the shipped kernels.

Every *shipped specialization* of the QK-norm + RoPE kernel (one per production model
shape, below) is compiled for sm_90 (Hopper) without a GPU, exactly as a real call
would build it, and measured:

* the call is made through the public ``ditfuse.qk_norm_rope`` on ``meta`` tensors of the
  production shape, with the kernel launch intercepted; the intercepted arguments go
  through Triton's own argument specialization (ints equal to 1 become constexprs, ints
  and pointers divisible by 16 get the divisibility attribute, large ints become i64),
  so the signature, constexprs (the heads a program and their pieces from
  ``launch_settings``), attributes and options (``num_warps``, ``enable_fp_fusion=False``)
  are those of the shipped build;
* ``triton.compile`` for ``GPUTarget("cuda", 90, 32)`` gives PTX, the cubin and the
  shared memory the launch requests;
* the ``ptxas`` of the Triton wheel is run again on that PTX with Triton's own flags plus
  ``-v`` -- its report (registers, spill stores/loads, stack frame) is the authority;
* ``cuobjdump`` of the wheel dumps the SASS of the cubin (``LDL``/``STL``: local-memory
  traffic) and its resource usage (cross-checked against ``ptxas -v``).

Compiling needs ``TRITON_INTERPRET=0`` *before* Triton defines the kernels, and ditfuse
turns the interpreter on when there is no GPU; so when this process cannot compile,
:func:`report` runs ``python -m ditfuse.tools.inspect`` in a subprocess with
``TRITON_INTERPRET=0`` and reads its JSON.

Usage::

    ditfuse inspect [--json PATH] [--only NAME ...] [--check] [--list]
    python -m ditfuse.tools.inspect [same options]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import triton

from ditfuse.aot.compile import (
    ARCH,
    can_compile_here,
    compile_sm90,
    intercept_launches,
    missing_tools,
    run_cuobjdump,
    wheel_tool_path,
)

WARP_SIZE = 32
_CHILD_ENV = "DITFUSE_INSPECT_CHILD"

# Hopper per-SM limits, for the theoretical occupancy column
_SM_REGS = 65536
_SM_MAX_WARPS = 64
_SM_MAX_BLOCKS = 32
_SM_SMEM = 228 * 1024
_SM_SMEM_RESERVED_PER_BLOCK = 1024
SMEM_PER_BLOCK = _SM_SMEM - _SM_SMEM_RESERVED_PER_BLOCK  # 227 KB: the most a block can have


def smem_violations(smem: int) -> list:
    """The build gate's complaint about ``smem`` bytes of shared memory a block, if any."""
    if smem > SMEM_PER_BLOCK:
        return [f"shared memory {smem} B > {SMEM_PER_BLOCK // 1024} KB"]
    return []


# ---------------------------------------------------------------------------------------
# the shipped specializations


@dataclass(frozen=True)
class Spec:
    """One production call of ``ditfuse.qk_norm_rope`` (both q and k, no positions).

    ``S`` is a representative production token count; what of it reaches the binary is
    only its class (== 1, divisible by 16, fits int32), as for every stride.
    """

    name: str
    model: str
    H: int
    D: int
    S: int
    dtype: str = "bf16"  # activation (and norm parameter) dtype
    norm: str = "rms"  # "rms" | "layer" | "dyt"
    span_all: bool = False  # one statistic across all heads of a token (Wan)
    weight: bool = True
    bias: bool = False
    alpha_tensor: bool = False  # DyT alpha as a one-element tensor
    round_before_weight: bool = False  # diffusers' RMSNorm with a bf16/fp16 weight
    rope_style: str = "interleaved"  # "interleaved" | "half"
    rotary_dim: Optional[int] = None  # None: D
    table_width: Optional[int] = None  # None: rotary_dim (repeat-interleaved / cat-duplicated)
    table_dtype: str = "fp32"
    table_per_head: bool = False  # (1, S, H, W) table expanded per head
    table_view: bool = False  # the table as every other column of one twice as wide
    # (Wan's cos[..., 0::2]; Qwen's view_as_real halves)
    layout: str = "flat"  # "flat" (B, S, H*D) + num_heads | "bshd" | "bhsd"
    packed: int = 0  # q, k are chunks of one fused projection of this many
    k_chunk: int = 1  # chunks (in place); k is chunk number k_chunk
    B: int = 1
    quantize: Optional[str] = None  # "int8" | "fp8": the 8-bit outputs of 8-bit attention

    @property
    def R(self) -> int:
        return self.rotary_dim if self.rotary_dim is not None else self.D

    @property
    def W(self) -> int:
        return self.table_width if self.table_width is not None else self.R

    def describe(self) -> str:
        norm = {"rms": "rms", "layer": "ln", "dyt": "dyt"}[self.norm]
        norm += "/all" if self.span_all else "/head"
        if self.weight:
            norm += "+w"
        if self.bias:
            norm += "+b"
        if self.alpha_tensor:
            norm += "+alpha*"
        if self.round_before_weight:
            norm += "(rw)"
        rope = ("il" if self.rope_style == "interleaved" else "half") + f" r{self.R} w{self.W}"
        if self.table_per_head:
            rope += " per-head"
        if self.table_view:
            rope += " view"
        out = f", {self.quantize} out" if self.quantize else ""
        return f"{norm}, {rope}{out}"


_WAN14B = dict(
    model="Wan2.1 14B 720p", H=40, D=128, S=21 * 45 * 80, norm="rms", span_all=True, layout="flat"
)
_FLUX2 = dict(model="FLUX.2 dev 1024^2", H=48, D=128, S=4096 + 512, layout="bshd")

#: Every shipped specialization, in report order.
SPECS: List[Spec] = [
    # Wan: torch.nn.RMSNorm(H*D) across heads; the patched processor passes the
    # cos[..., 0::2] / sin[..., 1::2] columns of its (1, S, 1, D) fp32 tables packed, one
    # value a pair (patching.table_once): "wan14b-half-table"; direct calls with the
    # full-width tables or the columns as strided views: "wan14b", "wan14b-table-view"
    Spec("wan14b", **_WAN14B),
    Spec(
        "wan14b-half-table", **{**_WAN14B, "model": "Wan2.1 14B, half-width tables"}, table_width=64
    ),
    Spec(
        "wan14b-table-view",
        **{**_WAN14B, "model": "Wan2.1 14B, strided half tables"},
        table_width=64,
        table_view=True,
    ),
    Spec(
        "wan14b-packed",
        **{**_WAN14B, "model": "Wan2.1 14B, fused QKV, in place"},
        packed=3,
        k_chunk=1,
        table_width=64,
    ),
    Spec(
        "wan1.3b",
        **{**_WAN14B, "model": "Wan2.1 1.3B 480p", "H": 12, "S": 21 * 30 * 52},
        table_width=64,
    ),
    # FLUX.1 / FLUX.2: torch.nn.RMSNorm(D) per head, interleaved fp32 (S, D) table
    Spec("flux1", model="FLUX.1 dev 1024^2", H=24, D=128, S=4096 + 512, layout="bshd"),
    Spec("flux2", **_FLUX2),
    # Qwen-Image: diffusers RMSNorm(D) (bf16 weight: rounds before it); complex freqs =
    # unique frequencies, the real / imaginary parts of the (S, D/2) complex table (packed)
    Spec(
        "qwen",
        model="Qwen-Image 1328^2",
        H=24,
        D=128,
        S=83 * 83,
        round_before_weight=True,
        table_width=64,
        layout="bshd",
    ),
    # HunyuanVideo: diffusers RMSNorm(D) per head (rounds before its bf16 weight),
    # interleaved (S, D) table over the video tokens
    Spec(
        "hunyuan",
        model="HunyuanVideo 720p 129f",
        H=24,
        D=128,
        S=33 * 45 * 80,
        round_before_weight=True,
        layout="bshd",
    ),
    # Stable Audio 3: StableAudio3RMSNorm(64), partial rotate-half RoPE over 32 channels,
    # q1/k1 chunks of the differential [q1|q2|k1|k2|v] to_qkv output
    Spec(
        "sa3",
        model="Stable Audio 3",
        H=24,
        D=64,
        S=1024,
        rope_style="half",
        rotary_dim=32,
        table_width=32,
        packed=5,
        k_chunk=2,
    ),
    # SAME-L: DynamicTanh (alpha parameter, gamma, beta), rotate-half RoPE over 32 channels
    Spec(
        "same-l",
        model="SAME-L",
        H=24,
        D=64,
        S=2048,
        norm="dyt",
        bias=True,
        alpha_tensor=True,
        rope_style="half",
        rotary_dim=32,
        table_width=32,
        packed=5,
        k_chunk=2,
    ),
    # dtype variants
    Spec("wan14b-fp16", **{**_WAN14B, "model": "Wan2.1 14B, fp16"}, dtype="fp16"),
    Spec("wan14b-fp32", **{**_WAN14B, "model": "Wan2.1 14B, fp32"}, dtype="fp32"),
    Spec("flux2-fp16", **{**_FLUX2, "model": "FLUX.2, fp16"}, dtype="fp16"),
    Spec("flux2-fp32", **{**_FLUX2, "model": "FLUX.2, fp32"}, dtype="fp32"),
    # the table expanded per head: (1, S, H, D) (TABLE_PER_HEAD)
    Spec(
        "wan14b-table-per-head",
        **{**_WAN14B, "model": "Wan2.1 14B, per-head table"},
        table_per_head=True,
    ),
    # the quantizing prologue of 8-bit attention (quantize="int8"): Wan through the flat-row
    # kernel's pair form (the 16-bit call's form), FLUX.2 through the per-token kernel
    Spec(
        "wan14b-int8",
        **{**_WAN14B, "model": "Wan2.1 14B, int8 Q / K"},
        table_width=64,
        quantize="int8",
    ),
    Spec("flux2-int8", **{**_FLUX2, "model": "FLUX.2, int8 Q / K"}, quantize="int8"),
]

SPEC_NAMES: List[str] = [s.name for s in SPECS]


# ---------------------------------------------------------------------------------------
# tools

# ---------------------------------------------------------------------------------------
# building one specialization exactly as a call would

_TORCH_DT = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _call_args(spec: Spec):
    """(positional args, keyword args) of ``ditfuse.qk_norm_rope`` for ``spec``, on meta."""
    import torch

    from ditfuse.norms import NormSpec

    dt = getattr(torch, _TORCH_DT[spec.dtype])
    tdt = getattr(torch, _TORCH_DT[spec.table_dtype])
    B, S, H, D = spec.B, spec.S, spec.H, spec.D
    HD = H * D
    meta = dict(device="meta")
    if spec.packed:
        buf = torch.empty(B, S, spec.packed * HD, dtype=dt, **meta)
        q = buf[..., :HD]
        k = buf[..., spec.k_chunk * HD : (spec.k_chunk + 1) * HD]
    else:
        # two allocations; carved from one buffer only so that their data_ptr differ on meta
        buf = torch.empty(2 * B * S * HD, dtype=dt, **meta)
        q = buf[: B * S * HD].view(B, S, HD)
        k = buf[B * S * HD :].view(B, S, HD)
    kw = {}
    if spec.layout == "flat":
        kw["num_heads"] = H
    elif spec.layout == "bshd":
        q, k = q.unflatten(2, (H, D)), k.unflatten(2, (H, D))
    elif spec.layout == "bhsd":
        if spec.packed:
            q, k = (t.unflatten(2, (H, D)).transpose(1, 2) for t in (q, k))
        else:
            q, k = q.view(B, H, S, D), k.view(B, H, S, D)
        kw["layout"] = "bhsd"
    else:
        raise ValueError(spec.layout)

    n = H * D if spec.span_all else D

    def norm():
        p = lambda: torch.empty(n, dtype=dt, **meta)  # noqa: E731
        alpha = (
            (torch.empty(1, dtype=dt, **meta) if spec.alpha_tensor else 0.5)
            if spec.norm == "dyt"
            else None
        )
        return NormSpec(
            spec.norm,
            weight=p() if spec.weight else None,
            bias=p() if spec.bias else None,
            eps=None if spec.norm == "dyt" else 1e-6,
            alpha=alpha,
            size=n,
            round_before_weight=spec.round_before_weight,
        )

    W = spec.W
    if spec.table_per_head:
        cos = torch.empty(1, S, 1, W, dtype=tdt, **meta).expand(1, S, H, W)
        sin = torch.empty(1, S, 1, W, dtype=tdt, **meta).expand(1, S, H, W)
    elif spec.table_view:
        cos = torch.empty(S, 2 * W, dtype=tdt, **meta)[:, 0::2]
        sin = torch.empty(S, 2 * W, dtype=tdt, **meta)[:, 1::2]
    else:
        cos = torch.empty(S, W, dtype=tdt, **meta)
        sin = torch.empty(S, W, dtype=tdt, **meta)
    kw.update(q_norm=norm(), k_norm=norm(), rope_style=spec.rope_style, inplace=bool(spec.packed))
    if spec.quantize:
        kw["quantize"] = spec.quantize
    if spec.rotary_dim is not None or spec.table_width is not None:
        kw["rotary_dim"] = spec.R
    return (q, k, cos, sin), kw


def capture_launch(spec: Spec):
    """The (grid, args, kwargs) with which ``ditfuse.qk_norm_rope`` launches the kernel."""
    import importlib

    from ditfuse.kernels import qk_flat as _qk_flat_kernel
    from ditfuse.kernels import qk_token as _qk_kernel

    qkr = importlib.import_module("ditfuse.ops.qk_norm_rope")
    args, kw = _call_args(spec)
    calls = intercept_launches(
        [(_qk_kernel, "_qk_norm_rope_kernel"), (_qk_flat_kernel, "_qk_norm_rope_flat_kernel")],
        lambda: qkr.qk_norm_rope(*args, **kw),
    )
    if len(calls) != 1:
        raise RuntimeError(f"{spec.name}: expected one kernel launch, saw {len(calls)}")
    return calls[0]


# ---------------------------------------------------------------------------------------
# measuring


def occupancy_warps(regs: int, num_warps: int, smem_bytes: int) -> int:
    """Theoretical resident warps per SM on Hopper (registers, smem, block/warp limits)."""
    per_warp = triton.cdiv(max(regs, 1), 8) * 8 * WARP_SIZE  # allocated in units of 8
    blocks = min(
        _SM_MAX_BLOCKS,
        _SM_MAX_WARPS // num_warps,
        (_SM_REGS // per_warp) // num_warps,
        _SM_SMEM // (smem_bytes + _SM_SMEM_RESERVED_PER_BLOCK),
    )
    return max(blocks, 0) * num_warps


def other_s_class(S: int) -> int:
    """A token count in the other divisibility class (Triton specializes ints on % 16)."""
    return S + 1 if S % 16 == 0 else S + (16 - S % 16)


def qk_kernel_of(kwargs) -> object:
    """Which QK kernel a captured launch is for, by its constexprs: the flat-row kernel
    (``N0``) or the per-token kernel."""
    from ditfuse.kernels.qk_flat import _qk_norm_rope_flat_kernel
    from ditfuse.kernels.qk_token import _qk_norm_rope_kernel

    if "N0" in kwargs:
        return _qk_norm_rope_flat_kernel
    return _qk_norm_rope_kernel


def _build(spec: Spec) -> Dict:
    """Build ``spec`` exactly as shipped, compile it for sm_90 and measure it."""
    import importlib

    from ditfuse.kernels.qk_flat import _qk_norm_rope_flat_kernel
    from ditfuse.kernels.qk_token import _qk_norm_rope_kernel

    qkr = importlib.import_module("ditfuse.ops.qk_norm_rope")
    grid, args, kwargs = capture_launch(spec)
    kernel = qk_kernel_of(kwargs)
    ck, (signature, constexprs, attrs, options), ptxas = compile_sm90(kernel, args, kwargs)
    sass = run_cuobjdump(ck.asm["cubin"], ck.metadata.name)

    # the launch settings the call used, against the analytical table
    nw = kwargs["num_warps"]
    has_k = bool(kwargs.get("HAS_K", True))
    itemsize = args[0].element_size()
    if kernel is _qk_norm_rope_flat_kernel:  # a whole token a program, no head groups
        hg, p0, p1 = spec.H, kwargs["N0"], kwargs["N1"]
        st = qkr.launch_settings(spec.H, spec.D, flat=True, has_k=has_k, itemsize=itemsize)
        used = (p0, p1, nw, kwargs["SPLIT_QK"])
        if used != (st.piece0, st.piece1, st.num_warps, st.split_qk):
            raise RuntimeError(
                f"{spec.name}: flat launch used pieces / warps / split {used}, "
                f"launch_settings gives {st}"
            )
    else:
        tile = kwargs["TILE"]
        hg, p0, p1 = tile.heads, tile.piece0, tile.piece1
        span_all = bool(kwargs["Q_NORM"].span_all or kwargs["K_NORM"].span_all)
        st = qkr.launch_settings(
            spec.H, spec.D, flat=False, has_k=has_k, itemsize=itemsize, span_all=span_all
        )
        if kernel is _qk_norm_rope_kernel and (hg, p0, p1, nw) != (
            st.heads,
            st.piece0,
            st.piece1,
            st.num_warps,
        ):
            raise RuntimeError(
                f"{spec.name}: launch used heads / pieces / num_warps "
                f"{(hg, p0, p1, nw)}, launch_settings gives {st}"
            )
    return dict(
        S=spec.S,
        kernel=kernel.fn.__name__,
        grid=list(grid),
        hg=hg,
        p0=p0,
        p1=p1,
        num_warps=ck.metadata.num_warps,
        smem=ck.metadata.shared,
        **{k: ptxas[k] for k in ("regs", "spill_stores", "spill_loads", "stack")},
        **sass,
        occupancy_warps=occupancy_warps(
            ptxas["regs"], ck.metadata.num_warps, ck.metadata.shared + sass["smem_static"]
        ),
        constexprs={kernel.arg_names[k[0]]: v for k, v in sorted(constexprs.items())},
        signature={k: v for k, v in signature.items() if v != "constexpr"},
        attrs={kernel.arg_names[k[0]]: v for k, v in sorted(attrs.items()) if v},
        enable_fp_fusion=options.enable_fp_fusion,
        arch=f"sm_{ARCH}a",
        hash=ck.hash,
        ptxas_cmd=ptxas["ptxas_cmd"],
        ptxas_log=ptxas["ptxas_log"],
    )


_VARIANT_KEYS = (
    "S",
    "hash",
    "regs",
    "spill_stores",
    "spill_loads",
    "stack",
    "ldl",
    "stl",
    "cubin_regs",
    "cubin_local",
    "smem",
    "num_warps",
)


def inspect_spec(spec: Spec, s_variants: bool = True) -> Dict:
    """Measure ``spec``; with ``s_variants`` also its build for a token count in the other
    ``% 16`` class (a separate binary of the same specialization, listed in ``variants``
    and held to the same gate)."""
    import dataclasses

    t0 = time.perf_counter()
    row = dict(
        name=spec.name,
        model=spec.model,
        config=spec.describe(),
        H=spec.H,
        D=spec.D,
        dtype=spec.dtype,
        **_build(spec),
    )
    row["variants"] = []
    if s_variants:
        alt = _build(dataclasses.replace(spec, S=other_s_class(spec.S)))
        row["variants"].append({k: alt[k] for k in _VARIANT_KEYS})
    row["spec"] = asdict(spec)
    row["seconds"] = round(time.perf_counter() - t0, 2)
    row["violations"] = violations(row)
    for v in row["variants"]:
        row["violations"] += [f"(S={v['S']} build) {msg}" for msg in violations(v)]
    return row


def violations(row: Dict) -> List[str]:
    """What breaks the resource gate: spills, a stack frame, or local memory in the SASS."""
    out = []
    if row["spill_stores"] or row["spill_loads"]:
        out.append(f"spills {row['spill_stores']} B stored / {row['spill_loads']} B loaded")
    if row["stack"]:
        out.append(f"stack frame {row['stack']} B")
    if row["ldl"] or row["stl"]:
        out.append(f"{row['ldl']} LDL / {row['stl']} STL in SASS")
    if row.get("cubin_local"):
        out.append(f"cubin LOCAL {row['cubin_local']} B")
    if row.get("cubin_regs") is not None and row["cubin_regs"] != row["regs"]:
        out.append(f"ptxas -v says {row['regs']} registers, the shipped cubin {row['cubin_regs']}")
    return out


def _select(names: Optional[Sequence[str]]) -> List[Spec]:
    if not names:
        return list(SPECS)
    unknown = [n for n in names if n not in SPEC_NAMES]
    if unknown:
        raise ValueError(f"unknown specialization(s) {unknown}; known: {', '.join(SPEC_NAMES)}")
    return [s for s in SPECS if s.name in names]


def _report_here(names, s_variants: bool) -> List[Dict]:
    missing = missing_tools()
    if missing:
        raise RuntimeError(
            f"the Triton wheel has no {' / '.join(missing)} (looked in {wheel_tool_path('')})"
        )
    specs, rows, t0 = _select(names), [], time.perf_counter()
    for i, s in enumerate(specs, 1):
        rows.append(inspect_spec(s, s_variants))
        # progress on stderr (a parent process passes it through): the builds take a while
        print(
            f"[{i:>{len(str(len(specs)))}}/{len(specs)}] built {s.name} "
            f"({time.perf_counter() - t0:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    return rows


def _package_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


def _report_subprocess(names, s_variants: bool, timeout: Optional[float] = None) -> List[Dict]:
    env = dict(os.environ, TRITON_INTERPRET="0", **{_CHILD_ENV: "1"})
    env["PYTHONPATH"] = os.pathsep.join(
        [_package_root()] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    with tempfile.TemporaryDirectory(prefix="ditfuse-inspect-") as d:
        out = Path(d) / "report.json"
        cmd = [sys.executable, "-m", "ditfuse.tools.inspect", "--quiet", "--json", str(out)]
        if names:
            cmd += ["--only", *names]
        if not s_variants:
            cmd.append("--no-s-variants")
        # stderr passes through: the child's progress lines (and any traceback) show as
        # they come
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, timeout=timeout)
        if r.returncode or not out.exists():
            raise RuntimeError(
                f"{' '.join(cmd)} failed ({r.returncode}; its stderr is above):\n{r.stdout[-6000:]}"
            )
        return json.loads(out.read_text())["kernels"]


def report(names: Optional[Sequence[str]] = None, s_variants: bool = True) -> List[Dict]:
    """One dict per shipped specialization (``names`` selects some): resources on sm_90.

    Keys include ``name``, ``regs``, ``spill_stores``, ``spill_loads`` (bytes), ``stack``
    (bytes), ``smem`` (bytes of shared memory the launch requests), ``num_warps``,
    ``ldl``/``stl`` (local-memory instructions in the SASS), ``variants`` (the same
    specialization built for a token count in the other ``% 16`` class, when
    ``s_variants``) and ``violations`` (empty: the resource gate holds, variants included).
    Runs in a ``TRITON_INTERPRET=0`` subprocess when this process cannot compile.
    """
    _select(names)  # validate early
    if can_compile_here():
        return _report_here(names, s_variants)
    if os.environ.get(_CHILD_ENV):
        raise RuntimeError(
            "ditfuse's kernels are interpreted in this process although "
            "TRITON_INTERPRET=0 was asked for (was triton imported earlier "
            "with TRITON_INTERPRET=1?)"
        )
    return _report_subprocess(names, s_variants)


# ---------------------------------------------------------------------------------------
# CLI

# HG=P0+P1: heads a program as power-of-two pieces (per-token kernel); a flat-row row shows
# its channel pieces ("ch") and "/2" when Q and K run in programs of their own
_COLUMNS = [
    ("name", 22),
    ("HxD", 7),
    ("dtype", 5),
    ("HG=P0+P1", 9),
    ("regs", 4),
    ("spill st/ld", 11),
    ("stack", 5),
    ("smem", 6),
    ("warps", 5),
    ("LDL/STL", 7),
    ("warps/SM", 8),
]


def format_table(rows: Sequence[Dict]) -> str:
    def cells(r):
        if r["kernel"] == "_qk_norm_rope_flat_kernel":
            pieces = f"{r['p0']}+{r['p1']} ch" + ("/2" if r["grid"][1] == 2 else "")
        else:
            pieces = f"{r['hg']}={r['p0']}+{r['p1']}"
        return [
            r["name"],
            f"{r['H']}x{r['D']}",
            r["dtype"],
            pieces,
            str(r["regs"]),
            f"{r['spill_stores']}/{r['spill_loads']}",
            str(r["stack"]),
            str(r["smem"]),
            str(r["num_warps"]),
            f"{r['ldl']}/{r['stl']}",
            str(r["occupancy_warps"]),
        ]

    widths = [
        max(w, len(h), *(len(cells(r)[i]) for r in rows)) for i, (h, w) in enumerate(_COLUMNS)
    ]

    def line(cs):
        return " | ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cs, widths))
        )

    out = [line([h for h, _ in _COLUMNS]), "-+-".join("-" * w for w in widths)]
    out += [line(cells(r)) for r in rows]
    bad = [r for r in rows if r["violations"]]
    out.append("")
    keys = ("regs", "spill_stores", "spill_loads", "stack", "ldl", "stl")
    with_var = [r for r in rows if r.get("variants")]
    if with_var:
        differ = [
            f"{r['name']} (S={v['S']}: {v['regs']} regs, spill {v['spill_stores']}/"
            f"{v['spill_loads']}, stack {v['stack']}, LDL/STL {v['ldl']}/{v['stl']})"
            for r in with_var
            for v in r["variants"]
            if any(v[k] != r[k] for k in keys)
        ]
        out.append(
            "each specialization also built for a token count S in the other %16 class: "
            + (
                "same registers, spills, stack and LDL/STL for all"
                if not differ
                else "differs for " + "; ".join(differ)
            )
        )
    if bad:
        out.append(f"RESOURCE GATE FAILED for {len(bad)} of {len(rows)} specializations:")
        out += [f"  {r['name']}: {'; '.join(r['violations'])}" for r in bad]
    else:
        out.append(
            f"resource gate: ok ({len(rows)} specializations, sm_{ARCH}a: no spills, "
            "no stack frame, no LDL/STL)"
        )
    return "\n".join(out)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ditfuse inspect",
        description="Compile every shipped specialization of ditfuse's QK-norm + RoPE kernel "
        f"for sm_{ARCH} (no GPU needed) and report registers, spills, stack, "
        "shared memory, warps and local-memory instructions.",
    )
    p.add_argument(
        "--json", metavar="PATH", help="also write the full report as JSON ('-': stdout)"
    )
    p.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        choices=SPEC_NAMES,
        help="inspect only these specializations",
    )
    switches = {
        "--check": "exit with status 1 if any specialization spills, has a stack frame or "
        "LDL/STL in its SASS",
        "--no-s-variants": "skip the second build of each specialization for a token count in "
        "the other %%16 class",
        "--list": "list the specializations and exit",
        "--quiet": "print no table",
    }
    for flag, what in switches.items():
        p.add_argument(flag, action="store_true", help=what)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(list(argv) if argv is not None else None)
    if args.list:
        for s in SPECS:
            print(f"{s.name:22} {s.model:32} {s.H}x{s.D} {s.dtype}  {s.describe()}")
        return 0
    t0 = time.perf_counter()
    rows = report(args.only, s_variants=not args.no_s_variants)
    if args.json:
        doc = json.dumps(
            dict(kernel="_qk_norm_rope_kernel", arch=f"sm_{ARCH}a", kernels=rows), indent=1
        )
        if args.json == "-":
            print(doc)
        else:
            Path(args.json).write_text(doc)
    if not args.quiet and args.json != "-":
        print(format_table(rows))
        print(f"({time.perf_counter() - t0:.1f} s)")
    if args.check and any(r["violations"] for r in rows):
        return 1
    return 0


inspect_main = main


if __name__ == "__main__":
    sys.exit(main())
