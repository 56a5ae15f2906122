"""PTX text: the entry signature and the packaging rules of ``docs/aot.md``, "The contract a
package meets".

Pure text processing (no Triton, no GPU). Every rule either rewrites the PTX and says what
it did, or refuses with an :class:`AotRefusal` that names the rule, what it found and what
to do instead:

* :func:`strip_unread_params` -- Triton (3.3+) appends ``global_scratch`` and
  ``profile_scratch`` pointer parameters that no runtime passes. They are removed from the
  entry signature only after proving that nothing in the body mentions them (no
  ``ld.param``, no ``mov``/``cvta`` of their address); one that is read is refused.
* :func:`retarget` -- ``.target sm_90a`` (what Triton emits for Hopper) becomes ``sm_90``
  only when no arch-specific instruction (``wgmma``, ``setmaxnreg``, ...) is present.
* :func:`fix_pointer_alignment` -- Triton declares pointer parameters ``.align 1``; they are
  declared with the alignment the code was compiled to assume (16 bytes, see there).
* :func:`check_shared_memory` -- more than 48 KB of shared memory (dynamic + static) is
  refused unless the caller opts in.
* :func:`check_tensor_cores` -- a kernel that should use tensor cores must contain ``mma``
  or ``wgmma`` instructions.
* :func:`check_contraction_safe` -- a kernel compiled without fp contraction must carry an
  explicit rounding mode on every floating-point add/sub/mul, or a runtime that JIT-compiles
  the PTX with the driver's defaults (TensorRT does) could fuse them into FMAs and change
  the results.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

#: TensorRT's limit for dynamic shared memory without an opt-in (see aot.md).
SMEM_LIMIT = 48 * 1024

#: Instructions that exist only on an arch-specific target (``sm_90a``, ``sm_100a``, ...);
#: the PTX ISA marks them "requires sm_90a" etc. A PTX using one cannot be retargeted to
#: the plain architecture. (The rewritten PTX is also assembled by ptxas for the plain
#: target, which is the final authority.)
ARCH_SPECIFIC = {
    "wgmma": "warpgroup MMA (wgmma.*): sm_90a / sm_100a only",
    "setmaxnreg": "register reallocation (setmaxnreg.*): sm_90a / sm_100a only",
    "tcgen05": "5th-generation tensor core ops (tcgen05.*): sm_100a only",
}


class AotRefusal(RuntimeError):
    """A packaging rule refused this kernel. ``rule`` names it; the message says why."""

    def __init__(self, rule: str, message: str):
        super().__init__(f"[{rule}] {message}")
        self.rule = rule


@dataclass(frozen=True)
class Param:
    """One ``.param`` of the entry signature."""

    name: str
    type: str  # u64, u32, b32, ...
    is_pointer: bool  # declared ``.ptr``
    align: Optional[int]  # ``.align N`` (pointee alignment for .ptr params)
    decl: str  # the declaration as written


@dataclass(frozen=True)
class Entry:
    name: str
    params: Tuple[Param, ...]
    start: int  # span of the parameter list text (between the parentheses)
    end: int


_ENTRY = re.compile(r"\.visible\s+\.entry\s+([A-Za-z_$][\w$]*)\s*\(([^)]*)\)", re.S)
_PARAM = re.compile(r"\.param\s+\.(\w+)((?:\s+(?:\.\w+|\d+))*)\s+([A-Za-z_$%][\w$]*)\s*$")
_TARGET = re.compile(r"^(\s*\.target\s+)(sm_\d+[a-z]?)([^\n]*)$", re.M)
_VERSION = re.compile(r"^\s*\.version\s+(\d+\.\d+)", re.M)


def entries(ptx: str) -> List[Entry]:
    out = []
    for m in _ENTRY.finditer(ptx):
        params = []
        body = m.group(2)
        for raw in (p.strip() for p in body.split(",")):
            if not raw:
                continue
            pm = _PARAM.match(raw)
            if not pm:
                raise ValueError(f"cannot parse PTX parameter declaration {raw!r}")
            quals = pm.group(2).split()
            am = re.search(r"\.align\s+(\d+)", raw)
            params.append(
                Param(
                    pm.group(3), pm.group(1), ".ptr" in quals, int(am.group(1)) if am else None, raw
                )
            )
        out.append(Entry(m.group(1), tuple(params), m.start(2), m.end(2)))
    return out


def entry(ptx: str, name: Optional[str] = None) -> Entry:
    """The ``.visible .entry`` named ``name`` (or the only one)."""
    es = entries(ptx)
    if name is not None:
        es = [e for e in es if e.name == name]
    if len(es) != 1:
        raise AotRefusal(
            "entry",
            f"expected one .visible .entry{f' named {name}' if name else ''} "
            f"in the PTX, found {len(es)}",
        )
    return es[0]


def target(ptx: str) -> str:
    m = _TARGET.search(ptx)
    if not m:
        raise AotRefusal("target", "the PTX has no .target directive")
    return m.group(2)


def ptx_version(ptx: str) -> Optional[str]:
    m = _VERSION.search(ptx)
    return m.group(1) if m else None


def _body_after(ptx: str, e: Entry) -> str:
    """The PTX text after the entry's parameter list (its body and anything following)."""
    return ptx[e.end :]


def param_uses(ptx: str, pname: str, e: Optional[Entry] = None) -> List[str]:
    """Lines outside the signature that mention parameter ``pname`` (``ld.param`` or any
    other use of its name, e.g. taking its address)."""
    e = e or entry(ptx)
    pat = re.compile(rf"(?<![\w$]){re.escape(pname)}(?![\w$])")
    text = ptx[: e.start] + "\n" + _body_after(ptx, e)
    return [
        ln.strip()
        for ln in text.splitlines()
        if pat.search(ln) and not ln.lstrip().startswith("//")
    ]


def strip_unread_params(ptx: str, keep: int, name: Optional[str] = None) -> Tuple[str, List[str]]:
    """Remove the entry's parameters after the first ``keep``, proving first that nothing
    reads them. Returns (new PTX, names removed)."""
    e = entry(ptx, name)
    if len(e.params) < keep:
        raise AotRefusal(
            "signature",
            f"entry {e.name} has {len(e.params)} parameters, fewer than "
            f"the {keep} the runtime passes",
        )
    tail = e.params[keep:]
    if not tail:
        return ptx, []
    for p in tail:
        uses = param_uses(ptx, p.name, e)
        if uses:
            raise AotRefusal(
                "scratch-param-read",
                f"refusing to strip parameter {p.name} of {e.name} (#{e.params.index(p)}, after "
                f"the {keep} the runtime passes): the kernel reads it ({uses[0]!r}"
                f"{f' and {len(uses) - 1} more' if len(uses) > 1 else ''}). A runtime that passes "
                "only inputs, extras and outputs (TensorRT) would hand it garbage; this kernel "
                "needs Triton's scratch buffer and cannot be packaged this way.",
            )
    kept = ",\n\t".join(p.decl for p in e.params[:keep])
    new = ptx[: e.start] + "\n\t" + kept + "\n" + ptx[e.end :]
    return new, [p.name for p in tail]


def arch_specific_instructions(ptx: str) -> List[Tuple[int, str]]:
    """(line number, line) of every instruction that needs an arch-specific target."""
    pat = re.compile(r"^\s*(?:@!?%?\w+\s+)?(" + "|".join(ARCH_SPECIFIC) + r")\.", re.M)
    out = []
    for i, ln in enumerate(ptx.splitlines(), 1):
        if pat.match(ln):
            out.append((i, ln.strip()))
    return out


def retarget(ptx: str, want: str) -> Tuple[str, Optional[str]]:
    """Set ``.target`` to ``want``; returns (PTX, note or None when unchanged).

    Only the arch-specific suffix may be dropped (``sm_90a`` -> ``sm_90``), and only when no
    arch-specific instruction is present.
    """
    have = target(ptx)
    if have == want:
        return ptx, None
    if have != want + "a":
        raise AotRefusal(
            "target",
            f"the PTX targets {have}; cannot retarget it to {want} "
            f"(only an arch-specific suffix may be dropped: {want}a -> {want})",
        )
    bad = arch_specific_instructions(ptx)
    if bad:
        kinds = sorted({ln.split(".")[0].split()[-1] for _, ln in bad})
        why = "; ".join(ARCH_SPECIFIC[k] for k in kinds if k in ARCH_SPECIFIC)
        raise AotRefusal(
            "arch-specific",
            f"cannot rewrite .target {have} -> {want}: the PTX uses {len(bad)} arch-specific "
            f"instruction(s) ({why}; first at line {bad[0][0]}: {bad[0][1]!r}). Package for "
            f"--target {have} (a runtime that accepts arch-specific PTX) or for an earlier "
            "architecture whose PTX the GPU can still run (e.g. sm_80: mma.sync).",
        )
    new = _TARGET.sub(lambda m: m.group(1) + want + m.group(3), ptx, count=1)
    return new, f".target {have} -> {want} (no arch-specific instruction present)"


def fix_pointer_alignment(ptx: str, align: int, name: Optional[str] = None) -> Tuple[str, int]:
    """Declare every ``.ptr`` parameter of the entry with ``.align {align}`` (Triton writes
    ``.align 1``). Returns (PTX, number of declarations changed)."""
    if align & (align - 1) or align < 1:
        raise ValueError(f"alignment must be a power of two, got {align}")
    e = entry(ptx, name)
    sig = ptx[e.start : e.end]
    n = 0

    def fix(m):
        nonlocal n
        if int(m.group(2)) != align:
            n += 1
        return m.group(1) + str(align)

    new_sig = re.sub(r"(\.ptr(?:\s+\.\w+)*?\s+\.align\s+)(\d+)", fix, sig)
    return ptx[: e.start] + new_sig + ptx[e.end :], n


_STATIC_SHARED = re.compile(
    r"^\s*(?!\.extern)(?:\.\w+\s+)*?\.shared\s+(?:\.align\s+\d+\s+)?"
    r"\.(\w+)\s+[\w$]+((?:\[\d+\])+)\s*(?:=[^;]*)?;",
    re.M,
)
_TYPE_BYTES = {
    "b8": 1,
    "u8": 1,
    "s8": 1,
    "b16": 2,
    "u16": 2,
    "s16": 2,
    "f16": 2,
    "bf16": 2,
    "b32": 4,
    "u32": 4,
    "s32": 4,
    "f32": 4,
    "b64": 8,
    "u64": 8,
    "s64": 8,
    "f64": 8,
    "b128": 16,
}


def static_shared_bytes(ptx: str) -> int:
    """Bytes of statically sized ``.shared`` arrays declared in the PTX."""
    total = 0
    for m in _STATIC_SHARED.finditer(ptx):
        n = _TYPE_BYTES.get(m.group(1), 1)
        for dim in re.findall(r"\[(\d+)\]", m.group(2)):
            n *= int(dim)
        total += n
    return total


def check_shared_memory(
    ptx: str, dynamic: int, allow_large: bool, limit: int = SMEM_LIMIT
) -> Dict[str, int]:
    """Refuse more than ``limit`` bytes of shared memory unless ``allow_large``."""
    static = static_shared_bytes(ptx)
    total = static + int(dynamic)
    if total > limit and not allow_large:
        raise AotRefusal(
            "shared-memory",
            f"the kernel needs {total} B of shared memory ({dynamic} B dynamic + {static} B "
            f"static), over {limit} B. A TensorRT engine needing more than 48 KB built but "
            "failed at enqueue in the seed project (the launch must first raise "
            "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES). Use smaller blocks / fewer "
            "stages, or pass --allow-large-smem if your runtime sets that attribute.",
        )
    return dict(dynamic=int(dynamic), static=static, total=total)


_MMA = re.compile(r"^\s*(?:@!?%?\w+\s+)?(wgmma|mma)\.", re.M)


def tensor_core_instructions(ptx: str) -> Counter:
    return Counter(m.group(1) for m in _MMA.finditer(ptx))


def check_tensor_cores(ptx: str, op: str) -> Counter:
    """Refuse a tensor-core kernel whose PTX has no ``mma`` / ``wgmma``."""
    found = tensor_core_instructions(ptx)
    if not found:
        raise AotRefusal(
            "no-tensor-cores",
            f"{op} is a tensor-core kernel (tl.dot) but its PTX has no mma / wgmma instruction: "
            "the dot fell back to FMA (e.g. a block dimension under 16, or an input precision "
            "the target has no MMA for). It would run many times slower than the JIT kernel; "
            "refusing to package it.",
        )
    return found


_FLOAT_OP = re.compile(
    r"^\s*(?:@!?%?\w+\s+)?((?:add|sub|mul|fma|div|sqrt|rsqrt|rcp|ex2|lg2|"
    r"min|max|neg|abs|tanh|sin|cos)(?:\.[a-z0-9]+)*)\s",
    re.M,
)
_UNROUNDED = re.compile(
    r"^\s*(?:@!?%?\w+\s+)?((?:add|sub|mul)(?:\.ftz)?(?:\.sat)?"
    r"\.(?:f32|f64|f16|f16x2|bf16|bf16x2))\s",
    re.M,
)


def float_op_histogram(ptx: str) -> Counter:
    """Count of every floating-point arithmetic instruction (mnemonic with modifiers)."""
    return Counter(
        m for m in _FLOAT_OP.findall(ptx) if re.search(r"\.(f16|bf16|f32|f64|f16x2|bf16x2)\b", m)
    )


def check_contraction_safe(ptx: str) -> None:
    """Every floating-point add/sub/mul must name its rounding mode (``.rn``): ptxas and the
    driver's JIT may fuse an un-suffixed ``mul``+``add`` into an FMA (``--fmad=true`` is
    their default), which rounds once instead of twice."""
    bad = _UNROUNDED.findall(ptx)
    if bad:
        raise AotRefusal(
            "fp-contraction",
            f"the kernel was compiled without fp contraction, but {len(bad)} floating-point "
            f"instruction(s) carry no rounding mode (e.g. {bad[0]}): a runtime that JIT-compiles "
            "this PTX with default options (TensorRT) could fuse them into FMAs and change the "
            "results.",
        )
