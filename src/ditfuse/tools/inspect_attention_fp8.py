"""sm_90 builds of the 8-bit attention kernel on the CPU (no GPU): the launch that
:func:`ditfuse.ops.attention_fp8.launch` makes for each production shape, specialized as
Triton specializes it, compiled for sm_90a and measured with the wheel's ``ptxas -v`` and
``cuobjdump``: registers, spills, shared memory, and the instructions of the key loop that
set its speed (integer / e4m3 wgmma, ``MUFU.EX2``, no ``I2F``). Why each property matters:
docs/design/attention_fp8.md."""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from ditfuse.aot.compile import build_rows


@dataclass(frozen=True)
class BuildSpec:
    name: str
    H: int = 40
    S: int = 32760
    D: int = 128
    qk: str = "int8"  # "int8" | "fp8" (e4m3 q / k)
    window: object = None
    key_mask: bool = False  # a text-padding mask (HunyuanVideo, Qwen-Image)
    kernel: str = "_attention_8bit_kernel"  # or V's "_v_amax_kernel" / "_v_quant_kernel"


BUILD_SPECS = [
    BuildSpec("wan14b-480p"),
    BuildSpec("flux2-1024", H=48, S=4608),
    BuildSpec("d64-int8", H=16, S=4096, D=64),
    BuildSpec("wan14b-480p-e4m3", qk="fp8"),
    BuildSpec("band-d128", H=16, S=8192, window=(256, 256)),
    BuildSpec("hunyuan-544p-key-mask", H=24, S=67576, key_mask=True),
    BuildSpec("v-amax-wan14b-480p", kernel="_v_amax_kernel"),
    BuildSpec("v-quant-wan14b-480p", kernel="_v_quant_kernel"),
]
BUILD_NAMES = [s.name for s in BUILD_SPECS]

_CHILD_ENV = "DITFUSE_INSPECT_FP8_CHILD"


def capture_launch(spec: BuildSpec):
    """(grid, args, kwargs) of ``spec.kernel``'s launch in ``ditfuse.ops.attention_fp8.launch``
    for ``spec`` (meta tensors)."""
    from ditfuse.aot.compile import intercept_launches
    from ditfuse.kernels import attention_fp8 as K
    from ditfuse.ops import attention_fp8 as A

    dt = torch.int8 if spec.qk == "int8" else torch.float8_e4m3fn
    meta = dict(device="meta")
    q = torch.empty(1, spec.S, spec.H, spec.D, dtype=dt, **meta)
    v = torch.empty(1, spec.S, spec.H, spec.D, dtype=torch.bfloat16, **meta)
    sc = torch.empty(1, spec.H, spec.S, dtype=torch.float32, **meta)
    km = torch.empty(1, spec.S, dtype=torch.bool, **meta) if spec.key_mask else None
    p = A.plan(q, q, v, q_scale=sc, k_scale=sc, window=spec.window, key_mask=km)
    order = ("_v_amax_kernel", "_v_quant_kernel", "_attention_8bit_kernel")  # as launched
    calls = intercept_launches([(K, n) for n in order], lambda: A.launch(p))
    if len(calls) != len(order):
        raise RuntimeError(f"{spec.name}: expected {len(order)} launches, saw {len(calls)}")
    return calls[order.index(spec.kernel)]


def _loops(sass: str, conditional: bool = False):
    """Each loop of the SASS (between a backward branch's target and the branch) as its list
    of instructions, in program order; ``conditional``: only loops whose back edge is a
    predicated branch."""
    from ditfuse.aot.compile import _SASS_BRA, _SASS_INSTR

    ins = [(int(a, 16), text) for a, text in _SASS_INSTR.findall(sass)]
    spans = [
        (int(m.group(1), 16), addr)
        for addr, text in ins
        if (m := _SASS_BRA.search(text))
        and int(m.group(1), 16) < addr
        and (not conditional or text.lstrip().startswith("@"))
    ]
    return [[text for addr, text in ins if lo <= addr <= hi] for lo, hi in spans]


def key_loops(sass: str) -> list[list[str]]:
    """The instructions of each key loop: a loop with tensor-core work (``GMMA``) and a
    conditional back edge. Unconditional back edges are the warp-specialized kernels'
    partition dispatch and mbarrier-wait retry returns, which span code run once a
    program."""
    return [body for body in _loops(sass, conditional=True) if any("GMMA" in t for t in body)]


def key_loop_local(sass: str) -> int:
    """LDL / STL inside a key loop (:func:`key_loops`)."""
    return sum(
        bool(re.match(r"(?:@!?U?P\w+\s+)?(LDL|STL)\b", t)) for body in key_loops(sass) for t in body
    )


def key_loop_opcodes(sass: str) -> dict[str, int]:
    """Opcode counts of the longest key loop (:func:`key_loops`), predicates and modifiers
    kept (``QGMMA.64x8x32.F32.E4M3.E4M3``)."""
    loops = key_loops(sass)
    if not loops:
        return {}
    counts: dict[str, int] = {}
    for t in max(loops, key=len):
        words = t.split()
        op = words[1] if words[0].startswith("@") else words[0]
        counts[op] = counts.get(op, 0) + 1
    return counts


def _loop_bodies(sass: str):
    """The SASS instructions inside loops."""
    return [t for loop in _loops(sass) for t in loop]


def early_unpacks(sass: str) -> int:
    """e4m3 -> f16 unpacks (``F2FP.F16.E4M3.UNPACK_B``) placed in a loop before its first
    wgmma: ahead of the trip's scores they can only read the previous trip's P, the stale
    registers of the miscompiled row sum (docs/design/attention_fp8.md)."""
    n = 0
    for loop in _loops(sass):
        for t in loop:
            if "GMMA" in t:
                break
            n += "E4M3.UNPACK" in t
    return n


def _opcode(text: str) -> str:
    """``@P0 FFMA.FTZ R1, ...`` -> ``FFMA``."""
    words = text.split()
    op = words[1] if words[0].startswith("@") else words[0]
    return op.split(".")[0]


def loop_mix(sass: str, top: int = 12):
    """The first (unmasked) key loop: instructions a trip and the most frequent opcodes."""
    from collections import Counter

    loops = _loops(sass)
    if not loops:
        return 0, []
    return len(loops[0]), Counter(_opcode(t) for t in loops[0]).most_common(top)


def build(spec: BuildSpec) -> dict:
    import subprocess
    import tempfile
    from pathlib import Path

    from ditfuse.aot.compile import compile_sm90, tool_path
    from ditfuse.kernels import attention_fp8 as K
    from ditfuse.tools import inspect as ik

    kernel = getattr(K, spec.kernel)
    attention = spec.kernel == "_attention_8bit_kernel"

    grid, args, kwargs = capture_launch(spec)
    ck, _, pt = compile_sm90(kernel, args, kwargs)
    with tempfile.TemporaryDirectory(prefix="ditfuse-fp8-") as d:
        f = Path(d) / "k.cubin"
        f.write_bytes(ck.asm["cubin"])
        sass = subprocess.run(
            [tool_path("cuobjdump"), "--dump-sass", str(f)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    loop = _loop_bodies(sass)

    def count(pat):
        return sum(1 for t in loop if re.match(rf"(?:@!?U?P\w+\s+)?{pat}", t))

    row = dict(
        **{k: getattr(spec, k) for k in ("name", "H", "S", "D", "qk")},
        window=str(spec.window),
        kernel=spec.kernel,
        block_m=kwargs.get("BLOCK_M"),
        block_n=kwargs.get("BLOCK_N"),
        num_warps=ck.metadata.num_warps,
        num_stages=kwargs.get("num_stages"),
        smem=ck.metadata.shared,
        **{k: pt[k] for k in ("regs", "spill_stores", "spill_loads", "stack")},
        loop_igmma=count(r"IGMMA"),
        loop_qgmma=count(r"QGMMA"),
        loop_i2f=count(r"I2F"),
        loop_ex2=count(r"MUFU\.EX2"),
        loop_local=count(r"(LDL|STL)"),
        loop_early_unpacks=early_unpacks(sass),
        loop_instructions=len(loop),
        first_loop=loop_mix(sass),
    )
    bad = []
    if max(row["spill_stores"], row["spill_loads"], row["stack"]):
        bad.append(f"spills {row['spill_stores']} / {row['spill_loads']} B, stack {row['stack']} B")
    if row["loop_local"]:
        bad.append(f"{row['loop_local']} LDL / STL in the key loop")
    if attention and spec.qk == "int8" and not row["loop_igmma"]:
        bad.append("no integer wgmma (IGMMA) in the key loop")
    if attention and not row["loop_qgmma"]:
        bad.append("no e4m3 wgmma (QGMMA) in the key loop")
    if row["loop_early_unpacks"]:
        bad.append(f"{row['loop_early_unpacks']} e4m3 unpacks before a key loop's first wgmma")
    if row["loop_i2f"]:
        bad.append(f"{row['loop_i2f']} I2F in the key loop (the scores convert without one)")
    row["violations"] = bad + ik.smem_violations(row["smem"])
    return row


def build_report(names=None) -> list:
    """One row per :data:`BUILD_SPECS` entry (``names`` selects); compiles in a
    ``TRITON_INTERPRET=0`` subprocess when this process runs the interpreter."""
    return build_rows("ditfuse.tools.inspect_attention_fp8", BUILD_SPECS, build, _CHILD_ENV, names)
