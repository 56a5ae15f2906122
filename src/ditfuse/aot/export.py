"""Compile one specialization of a ditfuse op into an AOT package, on a machine with no GPU.

How a package is made (``export``):

1. **Capture.** The op's public function (``ditfuse.qk_norm_rope``, ...) is called on
   ``meta`` tensors of the package's layout with the kernel launch intercepted (the same
   machinery as ``ditfuse inspect``), at six (B, N) points: B in {2, 3} and three token
   counts. So every constexpr, launch setting and stride is the JIT call's own.
2. **Bind.** Each argument of the real kernel is explained in terms of the runtime
   parameters: a tensor argument is a runtime tensor plus a constant element offset (the
   K slice of a packed QKV is ``qkv + H*D``); an int is ``a + b*N`` (fitted on two points,
   checked on the other four; anything that depends on B or is not affine in N is
   refused); a float must be the same at every point. Launch settings that change with B
   or N are refused: a package has one.
3. **Wrap.** A thin ``@triton.jit`` kernel is generated whose signature is TensorRT's
   order -- input pointers, the INT32 extras, output pointers -- and which calls the real
   kernel with every other scalar (strides, eps, head counts, block sizes) a compile-time
   constant, strides that grow with N computed from N in int64. It is written into the
   package (``wrapper.py``) as provenance: nothing loads it at run time; the package's
   own loader (``ditfuse_aot_loader.py``, a copy of ``loader.py``) needs no Triton.
4. **Compile** with ``triton.compile(ASTSource(wrapper, ...), target=GPUTarget("cuda", cc,
   32))`` with the JIT call's options (num_warps, ``enable_fp_fusion=False``, ...) and
   16-byte divisibility on every pointer (what Triton assumes of torch allocations).
5. **Rewrite and check** the PTX (``ptx.py``): strip the unread scratch parameters,
   retarget ``sm_90a`` -> ``sm_90``, declare the pointers ``.align 16``, check rounding
   modes, shared memory, tensor cores.
6. **Assemble** the final PTX with the Triton wheel's ``ptxas -v`` (Triton's flags,
   ``--gpu-name`` the package target): the cubin of the package, and its registers,
   spills and stack; ``cuobjdump`` cross-checks registers and counts LDL/STL.
7. **Compare** with the JIT build of the same call (compiled here too): the
   floating-point instruction histogram of the two PTX must be equal (the same arithmetic,
   only address computation differs) -- refused otherwise, unless the entry explains the
   difference (``same_float_ops=False``: the attention's lambda = 1 folds the per-row
   multiply ``lam * (1 / l2)`` away, exactly); the difference is then recorded in the
   manifest.

Compiling needs ``TRITON_INTERPRET=0`` before Triton defines ditfuse's kernels; when this
process runs the interpreter, :func:`export` re-runs itself as ``python -m
ditfuse.aot.cli`` in a subprocess (as ``ditfuse inspect`` does).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ditfuse.aot import ptx as P
from ditfuse.aot.loader import ALIGN, FORMAT, eval_formula
from ditfuse.aot.ops import OpExport, TensorSpec
from ditfuse.aot.ops import get as get_op

CHILD_ENV = "DITFUSE_AOT_CHILD"
TARGETS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a")
_TRITON_DT = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}
_LAUNCH_OPTIONS = {
    "num_warps",
    "num_stages",
    "num_ctas",
    "enable_fp_fusion",
    "maxnreg",
    "launch_cooperative_grid",
    "launch_pdl",
    "debug",
    "ptx_options",
}


@dataclass
class Capture:
    B: int
    N: int
    tensors: Dict[str, Any]
    grid: Tuple[int, int, int]
    args: tuple
    kwargs: Dict[str, Any]


@dataclass
class Binding:
    """How the wrapper produces one argument of the real kernel (or one item of a tuple
    argument: a tensor's strides travel as one tuple)."""

    param: str
    kind: str  # "tensor" | "int" | "float" | "bool" | "none" | "tuple"
    ref: Optional[str] = None  # tensor: runtime tensor name
    offset: int = 0  # tensor: element offset; int: constant term
    per_n: int = 0  # int: coefficient of N
    value: Any = None  # float / bool constant; tuple: its NamedTuple class, or None
    items: Tuple["Binding", ...] = ()  # tuple: one binding an item

    def source(self, n: str = "N") -> str:
        if self.kind == "tensor":
            return self.ref + (f" + {self.offset}" if self.offset else "")
        if self.kind == "int":
            if self.per_n == 0:
                return str(self.offset)
            if self.per_n == 1 and self.offset == 0:
                return n
            s = f"{n}.to(tl.int64) * {self.per_n}"
            return f"({s} + {self.offset})" if self.offset else s
        if self.kind == "none":
            return "None"
        if self.kind == "tuple":
            inner = ", ".join(b.source(n) for b in self.items)
            if self.value is not None:
                return f"{self.value.__name__}({inner})"
            return f"({inner},)" if len(self.items) == 1 else f"({inner})"
        return repr(self.value)

    def describe(self) -> Any:
        if self.kind == "int":
            if self.per_n == 0:
                return self.offset
            s = "N" if self.per_n == 1 else f"{self.per_n} * N"
            return s + (f" + {self.offset}" if self.offset else "")
        if self.kind == "tensor":
            return self.ref + (f" + {self.offset}" if self.offset else "")
        if self.kind == "tuple":
            if self.value is not None:
                return {f: b.describe() for f, b in zip(self.value._fields, self.items)}
            return [b.describe() for b in self.items]
        return self.value

    def classes(self) -> List[type]:
        """The NamedTuple classes the wrapper builds this argument with."""
        if self.kind != "tuple":
            return []
        own = [self.value] if self.value is not None else []
        return own + [c for b in self.items for c in b.classes()]


#: Longest entry name. PTX and ELF put no limit on a symbol, TensorRT one of 1023 bytes on a
#: plugin name (the entry without "ditfuse_"); C guarantees 63 significant characters of an
#: identifier, and kernel.h declares ``<entry>_launch`` / ``<entry>_load``: 56 + 7 fits.
ENTRY_NAME_MAX = 56


def entry_name(op: str, tag: str, limit: int = ENTRY_NAME_MAX) -> str:
    """The package's kernel name, ``ditfuse_<op>_<tag>``: whole when it fits ``limit``;
    else cut after its last whole ``_``-separated word that leaves room for ``_`` and 8 hex
    digits of the full name's sha256 (so two long names that share a prefix differ)."""
    name = re.sub(r"\W", "_", f"ditfuse_{op}_{tag}").strip("_")
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    # the last "_" at which "<head>_<digest>" fits ("ditfuse_" guarantees one)
    head = name[: name.rfind("_", 0, limit - len(digest))].rstrip("_")
    return f"{head}_{digest}"


def parse_target(target: str) -> Tuple[int, str]:
    """("sm_90") -> (90, "sm_90"): the compute capability Triton compiles for."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
    return int(re.match(r"sm_(\d+)", target).group(1)), target


# ---------------------------------------------------------------------------------------
# 1. capture


def _meta_tensors(entry: OpExport, opts, B: int, N: int) -> Dict[str, Any]:
    import torch

    from ditfuse.aot.ops import _torch_dtype

    t: Dict[str, Any] = {}
    for s in entry.tensors(opts):
        if s.aliases:
            t[s.name] = t[s.aliases]
            continue
        shape = [B if d == "B" else N if d == "N" else int(d) for d in s.shape]
        t[s.name] = torch.empty(shape, dtype=_torch_dtype(s.dtype), device="meta")
    return t


def resolve_kernel(entry: OpExport, opts) -> OpExport:
    """``entry`` with the kernel its public call launches for ``opts`` (``kernel_for``)."""
    if entry.kernel_for is None:
        return entry
    return dataclasses.replace(entry, kernel=entry.kernel_for(opts))


def _kernel(entry: OpExport):
    mod, attr = entry.kernel.split(":")
    return getattr(importlib.import_module(mod), attr)


def capture(entry: OpExport, opts, B: int, N: int) -> Capture:
    """The launch the op's public function makes for these (meta) tensors."""
    from ditfuse.aot.compile import intercept_launches

    tensors = _meta_tensors(entry, opts, B, N)
    places = [
        (importlib.import_module(p.split(":")[0]), p.split(":")[1])
        for p in entry.lookups or (entry.kernel,)
    ]
    calls = intercept_launches(places, lambda: entry.call(opts, tensors))
    if len(calls) != 1:
        raise P.AotRefusal(
            "capture",
            f"{entry.op} launched {len(calls)} kernels for "
            f"(B, N) = ({B}, {N}); a package holds exactly one",
        )
    grid, args, kwargs = calls[0]
    if callable(grid):
        kernel = _kernel(entry)
        grid = grid({**dict(zip(kernel.arg_names, args)), **kwargs})
    grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
    return Capture(B, N, tensors, grid, tuple(args), dict(kwargs))


def capture_points(entry: OpExport, opts) -> List[Capture]:
    n0 = entry.example_n
    return [capture(entry, opts, B, N) for B in (2, 3) for N in (n0, n0 + 1, n0 + 37)]


# ---------------------------------------------------------------------------------------
# 2. bind


def _root(t):
    return t._base if t._base is not None else t


def _resolve_tensor(entry: OpExport, specs: Dict[str, TensorSpec], cap: Capture, pname: str, t):
    named = cap.tensors
    cands = [n for n, x in named.items() if _root(x) is _root(t)]
    if pname in entry.writes:
        name = entry.writes[pname]
        spec = specs[name]
        if cands and name not in cands and spec.aliases not in cands:
            raise P.AotRefusal(
                "capture",
                f"kernel parameter {pname} is stored to and should be "
                f"output {name}, but it points into {cands}",
            )
        base = named[name] if cands else None
    else:
        if not cands:
            raise P.AotRefusal(
                "capture",
                f"kernel parameter {pname} points to a tensor that is "
                f"none of the package's tensors ({', '.join(named)}): "
                "the launcher allocated it",
            )
        ins = [n for n in cands if specs[n].kind == "input"]
        name = (ins or cands)[0]
        base = named[name]
    offset = t.storage_offset() - (base.storage_offset() if base is not None else 0)
    from ditfuse.aot.ops import _torch_dtype

    if t.dtype != _torch_dtype(specs[name].dtype):
        raise P.AotRefusal(
            "capture",
            f"kernel parameter {pname} is a {t.dtype} view of "
            f"{name} ({specs[name].dtype}); reinterpreting casts are "
            "not supported",
        )
    return name, offset


def _is_namedtuple(v) -> bool:
    return isinstance(v, tuple) and hasattr(type(v), "_fields")


def _constexpr_names(kernel, kwargs) -> set:
    """The kernel's compile-time parameters; for a kernel known by its ``arg_names`` only,
    every keyword argument."""
    params = getattr(kernel, "params", None)
    if params is None:
        return set(kwargs)
    return {p.name for p in params if p.is_constexpr}


def _runtime_args(kernel, cap: Capture, constexprs: set) -> Dict[str, Any]:
    """The kernel's run-time arguments of one launch by parameter name, in parameter order:
    the positional ones and those passed by keyword (tuples of strides, say)."""
    names = kernel.arg_names
    given = dict(zip(names, cap.args))
    given.update({k: v for k, v in cap.kwargs.items() if k in names and k not in constexprs})
    return {n: given[n] for n in names if n in given}


def _bind_one(
    entry: OpExport,
    specs: Dict[str, TensorSpec],
    caps: List[Capture],
    fit: List[int],
    pname: str,
    vals: list,
) -> Binding:
    """The binding of one run-time argument (``vals``: its value at each capture); tuples
    item by item. ``fit``: the two captures (same B) that fit an int's a + b*N."""
    import torch

    v0 = vals[0]
    if isinstance(v0, torch.Tensor):
        refs = [_resolve_tensor(entry, specs, c, pname, v) for c, v in zip(caps, vals)]
        if len(set(refs)) != 1:
            raise P.AotRefusal(
                "shape-dependent-pointer",
                f"kernel parameter {pname} points to {sorted(set(refs))} at "
                "different shapes; the offset must be a constant",
            )
        return Binding(pname, "tensor", ref=refs[0][0], offset=refs[0][1])
    if v0 is None:
        return Binding(pname, "none")
    if isinstance(v0, tuple):
        if any(type(v) is not type(v0) or len(v) != len(v0) for v in vals):
            raise P.AotRefusal(
                "shape-dependent-scalar",
                f"kernel parameter {pname} takes values {vals} at (B, N) = "
                f"{[(c.B, c.N) for c in caps]}: tuples of one length and type",
            )
        items = tuple(
            _bind_one(entry, specs, caps, fit, f"{pname}[{j}]", [v[j] for v in vals])
            for j in range(len(v0))
        )
        return Binding(pname, "tuple", value=type(v0) if _is_namedtuple(v0) else None, items=items)
    if isinstance(v0, bool) or isinstance(v0, float):
        if any(type(v) is not type(v0) or v != v0 for v in vals):
            raise P.AotRefusal(
                "shape-dependent-scalar",
                f"kernel parameter {pname} takes values {vals} at (B, N) = "
                f"{[(c.B, c.N) for c in caps]}; only N can change at run time",
            )
        if isinstance(v0, float) and not math.isfinite(v0):
            raise P.AotRefusal("scalar", f"kernel parameter {pname} = {v0} is not finite")
        return Binding(pname, "bool" if isinstance(v0, bool) else "float", value=v0)
    if isinstance(v0, int):
        (ca, va), (cb, vb) = ((caps[i], vals[i]) for i in fit)
        b = (vb - va) // (cb.N - ca.N)
        a = va - b * ca.N
        bad = [(c.B, c.N, v) for c, v in zip(caps, vals) if a + b * c.N != v]
        if bad or (vb - va) % (cb.N - ca.N):
            raise P.AotRefusal(
                "non-affine-scalar",
                f"kernel parameter {pname} takes values {vals} at (B, N) = "
                f"{[(c.B, c.N) for c in caps]}: not a + b*N with a, b constants "
                "independent of the batch. Only the INT32 extras reach the kernel at run "
                "time, so every other integer must be a constant or follow from N.",
            )
        return Binding(pname, "int", offset=a, per_n=b)
    raise P.AotRefusal(
        "scalar", f"kernel parameter {pname} has an unsupported value {v0!r} ({type(v0).__name__})"
    )


def bind(
    entry: OpExport, opts, caps: List[Capture], kernel=None
) -> Tuple[List[Binding], Dict[str, Any], Dict[str, Any]]:
    """(bindings of the kernel's run-time params, constexprs, launch options).

    A run-time parameter may come positionally or by keyword, and may be a tuple (a
    tensor's strides): each item is bound as a parameter of its own would be."""
    kernel = kernel if kernel is not None else _kernel(entry)
    names = kernel.arg_names
    c0 = caps[0]
    specs = {s.name: s for s in entry.tensors(opts)}
    cst_names = _constexpr_names(kernel, c0.kwargs)
    runtime = [_runtime_args(kernel, c, cst_names) for c in caps]
    settings = [{k: v for k, v in c.kwargs.items() if k not in r} for c, r in zip(caps, runtime)]
    for c, r, st in zip(caps[1:], runtime[1:], settings[1:]):
        if list(r) != list(runtime[0]) or st != settings[0]:
            diff = {
                k: (settings[0].get(k), st.get(k))
                for k in set(settings[0]) | set(st)
                if settings[0].get(k) != st.get(k)
            }
            raise P.AotRefusal(
                "shape-dependent-launch",
                f"{entry.op}'s launch settings change with the shape: {diff} between (B, N) = "
                f"({c0.B}, {c0.N}) and ({c.B}, {c.N}). A package has one set of constexprs; "
                "it cannot follow a run-time N that changes them.",
            )
    # the two points that fit a + b*N (same B), the rest check it
    fit = [i for i, c in enumerate(caps) if c.B == c0.B][:2]
    out = [
        _bind_one(entry, specs, caps, fit, pname, [r[pname] for r in runtime])
        for pname in runtime[0]
    ]
    constexprs = {k: v for k, v in settings[0].items() if k in names}
    launch_opts = {k: v for k, v in settings[0].items() if k not in names}
    unknown = set(launch_opts) - _LAUNCH_OPTIONS
    if unknown:
        raise P.AotRefusal("capture", f"unknown launch keyword(s) {sorted(unknown)}")
    return out, constexprs, launch_opts


def check_grid(entry: OpExport, opts, caps: List[Capture]) -> Tuple[str, str, str]:
    grid = tuple(str(g) for g in entry.grid(opts, caps[0]))
    for c in caps:
        got = tuple(eval_formula(g, {"B": c.B, "N": c.N}) for g in grid)
        if got != c.grid:
            raise P.AotRefusal(
                "grid",
                f"grid formula {grid} gives {got} at (B, N) = "
                f"({c.B}, {c.N}), the launch used {c.grid}",
            )
    return grid


# ---------------------------------------------------------------------------------------
# 3. wrap


@dataclass(frozen=True)
class RuntimeParam:
    name: str
    kind: str  # input | extra | output
    dtype: str  # bf16 / fp16 / fp32 / int32
    spec: Optional[TensorSpec] = None


def runtime_params(entry: OpExport, opts) -> List[RuntimeParam]:
    specs = entry.tensors(opts)
    ins = [RuntimeParam(s.name, "input", s.dtype, s) for s in specs if s.kind == "input"]
    outs = [RuntimeParam(s.name, "output", s.dtype, s) for s in specs if s.kind == "output"]
    extras = [RuntimeParam(x, "extra", "int32") for x in entry.extras]
    return ins + extras + outs


def _literal(v) -> str:
    import triton.language as tl

    if isinstance(v, (bool, int, str)) or v is None:
        return repr(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, tl.dtype):
        return f"tl.{v.name if hasattr(v, 'name') else v}"
    if _is_namedtuple(v):
        fields = ", ".join(f"{f}={_literal(x)}" for f, x in zip(v._fields, v))
        return f"{type(v).__name__}({fields})"
    if isinstance(v, tuple):
        inner = ", ".join(_literal(x) for x in v)
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    raise P.AotRefusal("constexpr", f"cannot write constexpr value {v!r} ({type(v).__name__})")


def _classes(v) -> List[type]:
    """The NamedTuple classes a constexpr value is written with."""
    if not isinstance(v, tuple):
        return []
    own = [type(v)] if _is_namedtuple(v) else []
    return own + [c for x in v for c in _classes(x)]


def jsonable(v) -> Any:
    """A constexpr value as the manifest writes it (a NamedTuple as its fields)."""
    if _is_namedtuple(v):
        return {f: jsonable(x) for f, x in zip(v._fields, v)}
    if isinstance(v, tuple):
        return [jsonable(x) for x in v]
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    return str(v)


def wrapper_source(
    entry: OpExport,
    fn_name: str,
    params: List[RuntimeParam],
    bindings: List[Binding],
    constexprs: Dict[str, Any],
) -> str:
    """The wrapper kernel: the runtime parameters in TensorRT's order, and one call of the
    real kernel with every argument by name. A constexpr that is no plain literal (a
    NamedTuple of flags) is a module-level ``tl.constexpr`` of the wrapper, as the JIT
    call passes it: one value, not a tuple built inside the kernel."""
    mod, attr = entry.kernel.split(":")
    glob, args = [], [f"{b.param}={b.source()}" for b in bindings]
    for k, v in constexprs.items():
        if isinstance(v, tuple):
            glob.append(f"_{k} = tl.constexpr({_literal(v)})")
            args.append(f"{k}=_{k}")
        else:
            args.append(f"{k}={_literal(v)}")
    classes = {c: None for b in bindings for c in b.classes()}
    classes.update({c: None for v in constexprs.values() for c in _classes(v)})
    imports = (
        "".join(
            f"from {c.__module__} import {c.__name__}\n" for c in classes if c.__module__ != mod
        )
        + f"from {mod} import {attr} as _kernel"
        + "".join(f", {c.__name__}" for c in classes if c.__module__ == mod)
        + "\n"
    )
    lines, cur = [], "    _kernel("
    for i, a in enumerate(args):
        piece = a + ("," if i < len(args) - 1 else ")")
        if len(cur) + len(piece) + 1 > 96:
            lines.append(cur.rstrip())
            cur = "            "
        cur += piece + " "
    lines.append(cur.rstrip())
    sig = ", ".join(p.name for p in params)
    doc = "\n".join(
        f"    #   {p.name:10} {p.kind:6} {p.dtype}" + (f" {tuple(p.spec.shape)}" if p.spec else "")
        for p in params
    )
    consts = "".join(g + "\n" for g in glob)
    return (
        f'"""Generated by ditfuse.aot.export for {entry.op}: do not edit.\n\n'
        "Provenance only: the source kernel.ptx was compiled from (it needs triton and\n"
        "ditfuse); nothing loads it at run time (ditfuse_aot_loader.py launches the "
        "package).\n\n"
        f"TensorRT's argument order (inputs, INT32 extras, outputs); every other argument of\n"
        f'{entry.kernel} is a compile-time constant of this specialization.\n"""\n'
        f"import triton\nimport triton.language as tl\n\n{imports}\n"
        + (f"{consts}\n" if consts else "")
        + f"\n@triton.jit\ndef {fn_name}({sig}):\n{doc}\n"
        + "\n".join(lines)
        + "\n"
    )


def _import_wrapper(src: str, fn_name: str, tmpdir: str):
    path = Path(tmpdir) / f"{fn_name}.py"
    path.write_text(src)
    modname = f"_ditfuse_aot_{fn_name}_{hashlib.sha1(src.encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(modname, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    spec.loader.exec_module(mod)
    return getattr(mod, fn_name)


# ---------------------------------------------------------------------------------------
# 4-7. compile, rewrite, assemble, compare


def _ptxas(ptx_text: str, options, kernel_name: str, gpu_name: str, cc: int) -> Dict:
    """Assemble ``ptx_text`` with the wheel's ptxas, Triton's flags and ``-v``."""
    from ditfuse.aot.compile import ptxas_flags, ptxas_usage, tool_path

    flags = [f for f in ptxas_flags(options) if not f.startswith("--gpu-name")]
    flags.append(f"--gpu-name={gpu_name}")
    tool = tool_path("ptxas_blackwell" if cc >= 100 else "ptxas")
    with tempfile.TemporaryDirectory(prefix="ditfuse-aot-") as d:
        src, dst = Path(d) / "kernel.ptx", Path(d) / "kernel.cubin"
        src.write_text(ptx_text)
        r = subprocess.run([tool, *flags, str(src), "-o", str(dst)], capture_output=True, text=True)
        log = r.stdout + r.stderr
        if r.returncode:
            raise P.AotRefusal(
                "ptxas",
                f"ptxas --gpu-name={gpu_name} rejects the rewritten PTX "
                f"({r.returncode}):\n{log.strip()[-3000:]}",
            )
        cubin = dst.read_bytes()
    usage = ptxas_usage(log, kernel_name)
    ver = subprocess.run([tool, "--version"], capture_output=True, text=True).stdout.strip()
    return dict(
        cubin=cubin,
        registers=usage.pop("regs"),
        **usage,  # stack, spill_stores, spill_loads
        log=[ln.strip() for ln in log.splitlines() if ln.strip()],
        cmd=" ".join(["ptxas", *flags, "kernel.ptx", "-o", "kernel.cubin"]),
        version=ver.splitlines()[-1] if ver else "",
    )


def _sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def package_ptx(
    raw_ptx: str,
    name: str,
    n_runtime: int,
    target: str,
    *,
    op: str,
    metadata: Dict[str, Any],
    allow_large_smem: bool,
    tensor_cores: bool,
    no_contraction: bool,
    param_kinds: List[str],
) -> Tuple[str, List[str], Dict]:
    """Apply every rule of aot.md to Triton's PTX; (final PTX, notes, shared memory)."""
    notes = []
    for key in ("global_scratch_size", "profile_scratch_size"):
        if int(metadata.get(key) or 0):
            raise P.AotRefusal(
                "scratch-size",
                f"Triton reports {key} = {metadata[key]}: the "
                "kernel uses its scratch buffer, which no runtime "
                "passes; cannot package it",
            )
    e = P.entry(raw_ptx, name)
    ptx, stripped = P.strip_unread_params(raw_ptx, n_runtime, name)
    if stripped:
        notes.append(
            f"stripped {len(stripped)} trailing parameter(s) {', '.join(stripped)} "
            "(Triton's global/profile scratch pointers): proven unread (no ld.param "
            "or other use in the body)"
        )
    e = P.entry(ptx, name)
    for p, kind in zip(e.params, param_kinds):
        want_ptr = kind != "extra"
        if (
            p.is_pointer != want_ptr
            or (want_ptr and p.type != "u64")
            or (not want_ptr and p.type not in ("u32", "b32", "s32"))
        ):
            raise P.AotRefusal(
                "signature",
                f"PTX parameter {p.decl!r} does not match runtime parameter kind {kind!r}",
            )
    ptx, note = P.retarget(ptx, target)
    if note:
        notes.append(note)
    ptx, n = P.fix_pointer_alignment(ptx, ALIGN, name)
    if n:
        notes.append(
            f".align 1 -> .align {ALIGN} on {n} pointer parameter(s): the code was "
            f"compiled assuming {ALIGN}-byte aligned pointers (tt.divisibility=16, the "
            "16-byte vector loads it emits need it), so that is their natural alignment "
            "here, stricter than the element size"
        )
    if no_contraction:
        P.check_contraction_safe(ptx)
    smem = P.check_shared_memory(ptx, int(metadata.get("shared") or 0), allow_large_smem)
    if tensor_cores:
        found = P.check_tensor_cores(ptx, op)
        notes.append(f"tensor cores: {dict(found)}")
    return ptx, notes, smem


@dataclass(frozen=True)
class PackageOptions:
    """How a package is built, apart from the op's shape options (``ditfuse export``'s flags
    of the same names)."""

    target: Optional[str] = None  # None: the op's default target
    allow_large_smem: bool = False  # a kernel may need more than 48 KB of shared memory
    c_header: bool = False  # also write kernel.h / kernel.c
    # the software-pipelining depth (None: the JIT call's), to fit shared memory; it does not
    # change the arithmetic, which the float-op comparison with the JIT build checks
    num_stages: Optional[int] = None

    @classmethod
    def from_args(cls, args) -> "PackageOptions":
        """The options of parsed ``ditfuse export`` arguments."""
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def export_here(entry: OpExport, opts, out_dir, pkg: PackageOptions = PackageOptions()) -> Dict:
    """Export in this process (needs ``TRITON_INTERPRET=0`` kernels); returns the manifest."""
    from ditfuse.aot.compile import can_compile_here, missing_tools

    if not can_compile_here():
        raise RuntimeError(
            "ditfuse's kernels are interpreted in this process "
            "(TRITON_INTERPRET=1): use ditfuse.aot.export(), which re-runs in a "
            "TRITON_INTERPRET=0 subprocess"
        )
    if missing_tools():
        raise RuntimeError(f"the Triton wheel has no {', '.join(missing_tools())}")
    cc, target = parse_target(pkg.target or entry.default_target)
    out = Path(out_dir)
    entry = resolve_kernel(entry, opts)
    kernel = _kernel(entry)

    # no line info: the PTX (and its sha256) then depends on Triton and the kernel sources
    # only, not on where the files lie (the wrapper is compiled from a temporary file)
    saved_env = os.environ.get("TRITON_DISABLE_LINE_INFO")
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
    try:
        return _export_here(entry, opts, out, cc, target, kernel, pkg)
    finally:
        if saved_env is None:
            os.environ.pop("TRITON_DISABLE_LINE_INFO", None)
        else:
            os.environ["TRITON_DISABLE_LINE_INFO"] = saved_env


def _export_here(entry, opts, out, cc, target, kernel, pkg: PackageOptions):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ditfuse.aot.compile import run_cuobjdump, specialize
    from ditfuse.runtime.backend import mma_sync_only

    caps = capture_points(entry, opts)
    jit_kwargs = dict(caps[0].kwargs)
    num_stages = pkg.num_stages
    if num_stages is None:
        num_stages = entry.default_num_stages
        if callable(num_stages):
            num_stages = num_stages(opts, jit_kwargs)
    if num_stages is not None:
        if num_stages < 1:
            raise ValueError(f"num_stages must be >= 1, got {num_stages}")
        for c in caps:
            c.kwargs["num_stages"] = int(num_stages)
    bindings, constexprs, launch_opts = bind(entry, opts, caps)
    grid = check_grid(entry, opts, caps)
    params = runtime_params(entry, opts)
    fn_name = entry_name(entry.op, entry.tag(opts))
    src = wrapper_source(entry, fn_name, params, bindings, constexprs)

    gtarget = GPUTarget("cuda", cc, 32)
    _, _, _, options = specialize(kernel, caps[0].args, caps[0].kwargs, gtarget)
    sig = {p.name: ("i32" if p.kind == "extra" else "*" + _TRITON_DT[p.dtype]) for p in params}
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(params) if p.kind != "extra"}
    mma_sync = bool(jit_kwargs.get("MMA_SYNC"))  # compiled as the JIT call compiles it
    with tempfile.TemporaryDirectory(prefix="ditfuse-aot-") as d, mma_sync_only(mma_sync):
        wrapper = _import_wrapper(src, fn_name, d)
        ck = triton.compile(
            ASTSource(wrapper, sig, {}, attrs), target=gtarget, options=options.__dict__
        )
    md = ck.metadata
    name = md.name
    raw = ck.asm["ptx"]
    final, notes, smem = package_ptx(
        raw,
        name,
        len(params),
        target,
        op=entry.op,
        metadata=_metadata_dict(md),
        allow_large_smem=pkg.allow_large_smem,
        tensor_cores=entry.tensor_cores,
        no_contraction=not options.enable_fp_fusion,
        param_kinds=[p.kind for p in params],
    )
    asm = _ptxas(final, options, name, target, cc)
    sass = run_cuobjdump(asm["cubin"], name)
    if sass["cubin_regs"] != asm["registers"]:
        raise RuntimeError(
            f"ptxas -v says {asm['registers']} registers, cuobjdump of the same "
            f"cubin {sass['cubin_regs']}"
        )

    # the JIT build of the same call, for the arithmetic comparison
    jsig, jcst, jattrs, jopts = specialize(kernel, caps[0].args, jit_kwargs, gtarget)
    with mma_sync_only(mma_sync):
        jit = triton.compile(
            ASTSource(kernel, jsig, jcst, jattrs), target=gtarget, options=jopts.__dict__
        )
    h_pkg, h_jit = P.float_op_histogram(final), P.float_op_histogram(jit.asm["ptx"])
    arith_diff = {
        k: [h_pkg.get(k, 0), h_jit.get(k, 0)]
        for k in sorted(set(h_pkg) | set(h_jit))
        if h_pkg.get(k, 0) != h_jit.get(k, 0)
    }
    if arith_diff and entry.same_float_ops:
        raise P.AotRefusal(
            "arithmetic",
            f"the package's floating-point instructions differ "
            f"from the JIT build of the same call: {arith_diff} "
            "(package, JIT); the bitwise contract would not hold",
        )
    jit_asm = _ptxas(jit.asm["ptx"], jopts, jit.metadata.name, P.target(jit.asm["ptx"]), cc)

    out.mkdir(parents=True, exist_ok=True)
    ptx_bytes = final.encode()
    (out / "kernel.ptx").write_bytes(ptx_bytes)
    (out / "kernel.cubin").write_bytes(asm["cubin"])
    (out / "wrapper.py").write_text(src)
    (out / LOADER_FILE).write_text(loader_copy())
    final_entry = P.entry(final, name)
    symbols = _symbols(params)
    manifest = {
        "format": FORMAT,
        "op": entry.op,
        "summary": entry.summary,
        "entry": name,
        "target": target,
        "triton_target": P.target(raw),
        "ptx_version": P.ptx_version(final),
        "triton_version": triton.__version__,
        "ditfuse_version": _ditfuse_version(),
        "options": vars(opts),
        "parameters": [_param_json(p, pp) for p, pp in zip(params, final_entry.params)],
        "symbols": symbols,
        "grid": list(grid),
        "block": [md.num_warps * 32, 1, 1],
        "num_warps": md.num_warps,
        "shared_mem": smem["dynamic"],
        "cubin_shared_mem": sass["smem_static"],
        "registers": asm["registers"],
        "spill_stores": asm["spill_stores"],
        "spill_loads": asm["spill_loads"],
        "stack": asm["stack"],
        "local_memory_instructions": {"LDL": sass["ldl"], "STL": sass["stl"]},
        "sass_instructions": sass["sass_instructions"],
        "constexprs": {k: jsonable(v) for k, v in constexprs.items()},
        "bindings": {b.param: b.describe() for b in bindings},
        "kernel": entry.kernel,
        "compile_options": {
            "num_warps": options.num_warps,
            "num_stages": options.num_stages,
            "jit_num_stages": jopts.num_stages,
            "enable_fp_fusion": options.enable_fp_fusion,
            "pointer_divisibility": ALIGN,
        },
        "rewrites": notes,
        "jit_reference": {
            "registers": jit_asm["registers"],
            "spill_stores": jit_asm["spill_stores"],
            "float_ops": dict(sorted(h_jit.items())),
            "float_ops_equal": not arith_diff,
            "float_ops_diff": arith_diff,
            "float_ops_note": "" if not arith_diff else entry.float_ops_note,
        },
        "ptxas": {"cmd": asm["cmd"], "version": asm["version"], "log": asm["log"]},
        "contract": entry.contract,
        "files": {
            "ptx": "kernel.ptx",
            "cubin": "kernel.cubin",
            "wrapper": "wrapper.py",
            "loader": LOADER_FILE,
            "readme": "README.txt",
        },
        "file_roles": dict(FILE_ROLES),
        "sha256": {"ptx": _sha256(ptx_bytes), "cubin": _sha256(asm["cubin"])},
    }
    if pkg.c_header:
        from ditfuse.aot.cheader import emit

        h, c = emit(manifest, asm["cubin"])
        (out / "kernel.h").write_text(h)
        (out / "kernel.c").write_text(c)
        manifest["files"].update(header="kernel.h", source="kernel.c")
        manifest["file_roles"].update(C_FILE_ROLES)
    (out / "README.txt").write_text(package_readme(manifest, out.name))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


# ---------------------------------------------------------------------------------------
# what a package says about itself: README.txt and its own copy of the loader

#: the package's copy of ``ditfuse/aot/loader.py``: importable without Triton or ditfuse
LOADER_FILE = "ditfuse_aot_loader.py"

FILE_ROLES = {
    "kernel.ptx": "the kernel, rewritten for the runtime: what TensorRT and the driver's JIT take",
    "kernel.cubin": "kernel.ptx assembled by ptxas for the target",
    "manifest.json": "how to launch it: parameters in TensorRT's order, grid, block, shared "
    "memory, resources, sha256",
    LOADER_FILE: "a loader that needs neither Triton nor ditfuse (torch; to launch, also a GPU "
    "with its driver and cuda-python): a copy of ditfuse/aot/loader.py",
    "wrapper.py": "provenance only: the generated @triton.jit source the PTX was compiled "
    "from; it imports triton and ditfuse, and nothing loads it at run time",
    "README.txt": "this package's files and how to launch it",
}
C_FILE_ROLES = {
    "kernel.h": "the typed C launcher's declarations (<entry>_load, <entry>_launch)",
    "kernel.c": "the cubin as a byte array and the launcher over the CUDA driver API",
}


def loader_copy() -> str:
    """``loader.py`` as a package carries it (a comment on top says where it comes from)."""
    text = Path(__file__).with_name("loader.py").read_text()
    return (
        f"# Copied from ditfuse {_ditfuse_version()} (ditfuse/aot/loader.py) by ditfuse "
        "export: this package's loader;\n# it imports neither Triton nor ditfuse. See "
        "README.txt.\n" + text
    )


def package_readme(m: Dict, dirname: str = "DIR") -> str:
    """README.txt of a package: what each file is for and how to launch it."""
    ins = [p["name"] for p in m["parameters"] if p["kind"] == "input"]
    outs = [p["name"] for p in m["parameters"] if p["kind"] == "output"]
    cap = m["target"][3:].rstrip("a")
    arch = f"sm_{cap}" + ("" if m["target"].endswith("a") else " or newer")
    params = "\n".join(
        f"  {p['name']:10} {p['kind']:6} {p['dtype']:5} "
        + (
            f"= {p['value']}"
            if p["kind"] == "extra"
            else "("
            + ", ".join(map(str, p["shape"]))
            + ")"
            + (f", the memory of {p['aliases']}" if p.get("aliases") else "")
        )
        for p in m["parameters"]
    )
    files = "\n".join(f"  {f:22} {m['file_roles'][f]}" for f in m["file_roles"])
    call = ", ".join(ins)
    result = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ")"
    return f"""ditfuse AOT package: {m["op"]} for {
        m["target"]
    } (written by ditfuse export, ditfuse \
{m["ditfuse_version"]}, Triton {m["triton_version"]})
{m["summary"]}

Kernel {m["entry"]}
Parameters in launch order (inputs, INT32 extras, outputs); every tensor contiguous and
16-byte aligned:
{params}
grid ({", ".join(m["grid"])}), block ({", ".join(map(str, m["block"]))}), \
{m["shared_mem"]} B of dynamic shared memory.

Files
{files}

Python, without Triton or ditfuse: needs torch; launching also needs an NVIDIA GPU
({arch}) with its CUDA driver, a CUDA build of torch and cuda-python
(pip install cuda-python). Without them a launch raises NoGPUError saying what is
missing; bind() still checks the tensors and computes the launch.

    import sys
    sys.path.insert(0, "{dirname}")
    from ditfuse_aot_loader import load
    k = load("{dirname}")
    # launch on torch's current stream (CUDA tensors)
    {result} = k({call})
    # check the tensors and compute grid and arguments only (no GPU needed)
    launch = k.bind({call})

Where ditfuse is installed, ditfuse.aot.load("{dirname}") is the same loader.

TensorRT (>= 10.9, tensorrt.plugin): ditfuse.aot.trt_plugin.register("{dirname}") registers
it as a plugin (needs ditfuse); any other runtime passes kernel.ptx with the manifest's
grid, block, shared memory and extras.

C / C++: {
        "kernel.h / kernel.c (link with -lcuda)"
        if "header" in m["files"]
        else "re-export with --c-header for kernel.h / kernel.c"
    }.

Contract: {m["contract"]}
"""


def _metadata_dict(md) -> Dict[str, Any]:
    if hasattr(md, "_asdict"):
        return dict(md._asdict())
    return dict(vars(md))


def _ditfuse_version() -> str:
    try:
        from ditfuse._version import __version__

        return __version__
    except Exception:
        return "?"


def _symbols(params: List[RuntimeParam]) -> Dict[str, str]:
    out = {}
    for p in params:
        if p.kind != "input":
            continue
        for i, d in enumerate(p.spec.shape):
            if isinstance(d, str) and d not in out:
                out[d] = f"{p.name}.shape[{i}]"
    return out


def _param_json(p: RuntimeParam, pp: P.Param) -> Dict:
    d = {"name": p.name, "kind": p.kind, "dtype": p.dtype}
    if p.kind == "extra":
        d["value"] = p.name
    else:
        d["shape"] = list(p.spec.shape)
        d["layout"] = "contiguous"
        d["align"] = ALIGN
        if p.spec.aliases:
            d["aliases"] = p.spec.aliases
        if p.spec.doc:
            d["doc"] = p.spec.doc
    d["ptx_param"] = pp.name
    d["ptx_type"] = pp.type
    return d


# ---------------------------------------------------------------------------------------
# the public entry point


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def cli_argv(op: str, out_dir, pkg: PackageOptions, options: Dict[str, Any]) -> List[str]:
    entry = get_op(op)
    argv = [op, "-o", str(out_dir)]
    if pkg.target:
        argv += ["--target", pkg.target]
    if pkg.num_stages is not None:
        argv += ["--num-stages", str(pkg.num_stages)]
    if pkg.allow_large_smem:
        argv.append("--allow-large-smem")
    if pkg.c_header:
        argv.append("--c-header")
    for o in entry.options:
        if options.get(o.name) is not None:
            argv += [o.flag, str(options[o.name])]
    return argv


def run_subprocess(argv: List[str], capture: bool = True, timeout: Optional[float] = None):
    env = dict(os.environ, TRITON_INTERPRET="0", **{CHILD_ENV: "1"})
    env["PYTHONPATH"] = os.pathsep.join(
        [_package_root()] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    return subprocess.run(
        [sys.executable, "-m", "ditfuse.aot.cli", *argv],
        env=env,
        capture_output=capture,
        text=True,
        timeout=timeout,
    )


def export(
    op: str,
    out_dir,
    target: Optional[str] = None,
    *,
    allow_large_smem: bool = False,
    c_header: bool = False,
    num_stages: Optional[int] = None,
    **options,
) -> Dict:
    """Write the AOT package of ``op`` (one specialization) to ``out_dir``; its manifest.

    ``options`` are the op's shape options (``heads``, ``head_dim``, ``dtype`` for
    ``qk_norm_rope``; ``dim`` for the AdaLN ops; ``ditfuse export OP --help``); ``target``
    defaults to the op's (``sm_90``; ``sm_80`` for the attention, whose sm_90 build uses
    sm_90a-only wgmma); ``allow_large_smem``, ``c_header``, ``num_stages``: see
    :class:`PackageOptions`. Refusals raise :class:`ditfuse.aot.AotRefusal`. No GPU is needed.
    """
    from ditfuse.aot.compile import can_compile_here

    entry = get_op(op)
    opts = entry.resolve(**options)
    parse_target(target or entry.default_target)
    pkg = PackageOptions(
        target=target,
        allow_large_smem=allow_large_smem,
        c_header=c_header,
        num_stages=num_stages,
    )
    if can_compile_here():
        return export_here(entry, opts, out_dir, pkg)
    if os.environ.get(CHILD_ENV):
        raise RuntimeError(
            "ditfuse's kernels are interpreted although TRITON_INTERPRET=0 was "
            "asked for (was triton imported earlier with TRITON_INTERPRET=1?)"
        )
    r = run_subprocess(cli_argv(op, out_dir, pkg, vars(opts)))
    if r.returncode:
        m = re.search(r"refused \[([\w-]+)\] (.*)", r.stderr, re.S)
        if m:
            raise P.AotRefusal(m.group(1), m.group(2).strip())
        raise RuntimeError(
            f"ditfuse export {op} failed ({r.returncode}):\n{(r.stdout + r.stderr)[-6000:]}"
        )
    return json.loads((Path(out_dir) / "manifest.json").read_text())
