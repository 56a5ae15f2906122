"""Compiling ditfuse's kernels for a GPU target on a machine without one, and reading what
ptxas and cuobjdump say of the result: the public API behind ``ditfuse export`` and
``ditfuse inspect``.

A kernel compiles only where ditfuse's kernels are real ``JITFunction`` s
(:func:`can_compile_here`: ``TRITON_INTERPRET=0``, or a GPU); callers without one run
themselves in a subprocess with ``TRITON_INTERPRET=0``.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, Sequence

#: sm_90 (Hopper); ptxas is given --gpu-name=sm_90a, as Triton does
ARCH = 90


def tool_path(name: str) -> str:
    """Path of a CUDA tool as Triton finds it (the wheel's, unless TRITON_<NAME>_PATH)."""
    from triton import knobs

    return getattr(knobs.nvidia, name).path


def wheel_tool_path(name: str) -> Path:
    """Path of ``name`` (ptxas, cuobjdump) inside the installed Triton wheel."""
    import importlib.util

    spec = importlib.util.find_spec("triton")
    root = Path(spec.origin).parent if spec and spec.origin else Path("triton")
    return root / "backends" / "nvidia" / "bin" / name


def missing_tools() -> List[str]:
    """Tools this report needs that the Triton wheel lacks (empty: all present)."""
    return [
        n
        for n in ("ptxas", "cuobjdump")
        if not (wheel_tool_path(n).is_file() and os.access(wheel_tool_path(n), os.X_OK))
    ]


def can_compile_here() -> bool:
    """True when this process's ditfuse kernels are real (non-interpreted) JITFunctions."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    from ditfuse.kernels.qk_token import _qk_norm_rope_kernel as k

    return isinstance(k, JITFunction) and not isinstance(k, InterpretedFunction)


def build_rows(module: str, specs: Sequence, build: Callable, child_env: str, names=None) -> list:
    """``build(spec)`` of each of ``specs`` (``names`` selects by ``spec.name``) where the
    kernels compile here, else in a ``TRITON_INTERPRET=0`` subprocess running
    ``module.build_report`` (:func:`report_in_compiler`)."""
    known = [s.name for s in specs]
    unknown = set(names or ()) - set(known)
    if unknown:
        raise ValueError(f"unknown build spec(s) {sorted(unknown)}; known: {known}")
    chosen = [s for s in specs if not names or s.name in names]
    if can_compile_here():
        return [build(s) for s in chosen]
    return report_in_compiler(module, [s.name for s in chosen], child_env)


def report_in_compiler(module: str, names: List[str], child_env: str) -> list:
    """``module.build_report(names)`` in a subprocess with ``TRITON_INTERPRET=0`` (for a
    process whose ditfuse kernels are interpreted); its rows, read back as JSON. The child
    is marked with ``child_env`` so that a child that cannot compile either raises instead
    of starting another."""
    import json
    import sys

    if os.environ.get(child_env):
        raise RuntimeError("the kernels are interpreted although TRITON_INTERPRET=0")
    root = str(Path(__file__).resolve().parent.parent.parent)  # src/, above the package
    env = dict(os.environ, TRITON_INTERPRET="0", **{child_env: "1"})
    env["PYTHONPATH"] = os.pathsep.join(
        [root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    with tempfile.TemporaryDirectory(prefix="ditfuse-build-") as d:
        out = Path(d) / "rows.json"
        code = (
            f"import json; from {module} import build_report; "
            f"json.dump(build_report({list(names)!r}), open({str(out)!r}, 'w'))"
        )
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        if r.returncode or not out.exists():
            raise RuntimeError(
                f"sm_90 build failed ({r.returncode}):\n{(r.stdout + r.stderr)[-6000:]}"
            )
        return json.loads(out.read_text())


class _LaunchStub:
    """Stands in for the kernel: ``kernel[grid](*args, **kwargs)`` is recorded, not run."""

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append((grid, args, kwargs))

        return launch


def intercept_launches(places, call) -> list:
    """Run ``call()`` (under no_grad) with each kernel at ``places`` — ``(module,
    attribute)`` pairs — replaced by a recorder and every device treated as one the kernels
    run on, so that meta tensors pass; the recorded ``(grid, args, kwargs)`` launches.
    Everything patched is restored, also when ``call`` raises."""
    import torch

    from ditfuse.runtime import backend

    stub = _LaunchStub()
    saved = [(m, a, getattr(m, a)) for m, a in places]
    ok = backend.kernel_device_ok
    for m, a, _ in saved:
        setattr(m, a, stub)
    backend.kernel_device_ok = lambda t: True
    try:
        with torch.no_grad():
            call()
    finally:
        backend.kernel_device_ok = ok
        for m, a, v in saved:
            setattr(m, a, v)
    return stub.calls


def specialize(kernel, args, kwargs, target):
    """Triton's own (signature, constexprs, attrs, options) for a launch with these args."""
    from triton import knobs
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = make_backend(target)
    kwargs = dict(kwargs)
    # as JITFunction.run does before binding
    kwargs["debug"] = kwargs.get("debug", kernel.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(
        backend, kwargs, bound, specialization, options
    )
    return signature, constexprs, attrs, options


def compile_sm90(kernel, args, kwargs, source=None, mma_sync: bool = False):
    """``triton.compile`` for sm_90 of Triton's own specialization of a launch with these
    args (``source``: the AST source class, Triton's ``ASTSource`` when None; ``mma_sync``:
    compiled under ``runtime.backend.mma_sync_only``) and the wheel's ``ptxas -v`` of it:
    (compiled kernel, :func:`specialize`'s tuple, :func:`run_ptxas` report)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ditfuse.runtime.backend import mma_sync_only

    target = GPUTarget("cuda", ARCH, 32)
    spec = signature, constexprs, attrs, options = specialize(kernel, args, kwargs, target)
    with mma_sync_only(mma_sync):
        ck = triton.compile(
            (source or ASTSource)(kernel, signature, constexprs, attrs),
            target=target,
            options=options.__dict__,
        )
    return ck, spec, run_ptxas(ck.asm["ptx"], options, ck.metadata.name)


PTXAS_PROPS = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
PTXAS_REGS = re.compile(r"Used (\d+) registers")
_RES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
_SASS_LOCAL = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?(LDL|STL)\b", re.M)
_SASS_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", re.M)
_SASS_BRA = re.compile(r"\bBRA\s+(?:\S+\s+)?0x([0-9a-f]+)")


def local_in_loops(sass: str) -> int:
    """LDL / STL instructions inside a loop of the SASS: between the target of a backward
    branch and the branch (a branch to itself, the trap at a kernel's end, is no loop; nor
    is the unconditional return of an out-of-line block -- an mbarrier wait's retry, placed
    after the kernel's end -- to the instruction after the branch that entered it).
    Local memory touched once a program outside every loop (a value kept across the loop)
    costs a few cycles a program; inside a loop it costs every trip."""
    ins = [(int(a, 16), text) for a, text in _SASS_INSTR.findall(sass)]
    at = {addr: text for addr, text in ins}
    loops = []
    for addr, text in ins:
        m = _SASS_BRA.search(text)
        if not m or int(m.group(1), 16) >= addr:
            continue
        t = int(m.group(1), 16)
        entry = _SASS_BRA.search(at.get(t - 16, ""))
        if not text.lstrip().startswith("@") and entry and t < int(entry.group(1), 16) <= addr:
            continue  # an out-of-line block's return
        loops.append((t, addr))
    return sum(
        1
        for addr, text in ins
        if re.match(r"(?:@!?U?P\w+\s+)?(LDL|STL)\b", text)
        and any(lo <= addr <= hi for lo, hi in loops)
    )


def ptxas_flags(options) -> List[str]:
    """Triton's ``make_cubin`` flags (backends/nvidia/compiler.py), plus ``-v``."""
    from triton import knobs

    if knobs.compilation.disable_line_info:
        flags = ["-lineinfo", "-suppress-debug-info"]
    elif knobs.nvidia.disable_ptxas_opt:
        flags = ["-g"]
    else:
        flags = ["-lineinfo"]
    if not options.enable_fp_fusion:
        flags.append("--fmad=false")
    flags.append("-v")
    if knobs.nvidia.disable_ptxas_opt:
        flags += ["--opt-level", "0"]
    if options.ptx_options:
        flags += options.ptx_options.split(" ")
    return flags + [f"--gpu-name=sm_{ARCH}a"]


def run_ptxas(ptx: str, options, kernel_name: str) -> Dict:
    with tempfile.TemporaryDirectory(prefix="ditfuse-inspect-") as d:
        src = Path(d) / "k.ptx"
        src.write_text(ptx)
        cmd = [tool_path("ptxas"), *ptxas_flags(options), str(src), "-o", str(Path(d) / "k.cubin")]
        r = subprocess.run(cmd, capture_output=True, text=True)
    log = r.stdout + r.stderr
    if r.returncode:
        raise RuntimeError(f"ptxas failed ({r.returncode}):\n{log}")
    return dict(
        ptxas_usage(log, kernel_name),
        ptxas_log=[ln.strip() for ln in log.splitlines() if ln.strip()],
        ptxas_cmd=" ".join(["ptxas", *ptxas_flags(options), "<ptx>"]),
    )


def ptxas_usage(log: str, kernel_name: str) -> Dict:
    """``regs``, ``stack``, ``spill_stores``, ``spill_loads`` of ``kernel_name`` in a
    ``ptxas -v`` log; RuntimeError where the log does not say."""
    # the entry function's block: from "Compiling entry function '<name>'" to the next one
    m = re.search(
        rf"Compiling entry function '{re.escape(kernel_name)}'.*?(?=Compiling entry function|\Z)",
        log,
        re.S,
    )
    block = m.group(0) if m else log
    props, regs = PTXAS_PROPS.search(block), PTXAS_REGS.search(block)
    if not props or not regs:
        raise RuntimeError(f"cannot read ptxas -v output:\n{log}")
    return dict(
        regs=int(regs.group(1)),
        stack=int(props.group(1)),
        spill_stores=int(props.group(2)),
        spill_loads=int(props.group(3)),
    )


def run_cuobjdump(cubin: bytes, kernel_name: str) -> Dict:
    with tempfile.TemporaryDirectory(prefix="ditfuse-inspect-") as d:
        f = Path(d) / "k.cubin"
        f.write_bytes(cubin)
        cuobjdump = tool_path("cuobjdump")
        sass = subprocess.run(
            [cuobjdump, "--dump-sass", str(f)], capture_output=True, text=True, check=True
        ).stdout
        res = subprocess.run(
            [cuobjdump, "--dump-resource-usage", str(f)], capture_output=True, text=True, check=True
        ).stdout
    ops = _SASS_LOCAL.findall(sass)
    m = re.search(rf"Function {re.escape(kernel_name)}:\s*\n\s*{_RES.pattern}", res)
    if not m:
        raise RuntimeError(f"cannot read cuobjdump --dump-resource-usage:\n{res}")
    n_instr = len(re.findall(r"^\s*/\*[0-9a-f]{4,}\*/\s", sass, re.M))
    return dict(
        ldl=ops.count("LDL"),
        stl=ops.count("STL"),
        loop_local=local_in_loops(sass),
        sass_instructions=n_instr,
        cubin_regs=int(m.group(1)),
        cubin_stack=int(m.group(2)),
        smem_static=int(m.group(3)),
        cubin_local=int(m.group(4)),
    )
