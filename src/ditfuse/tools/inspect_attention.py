"""sm_90 builds of the band-attention kernels on the CPU (no GPU): tensor-core instructions,
registers, spills, shared memory of every production call's specialization (the kernels of
:mod:`ditfuse.kernels.attention`, :mod:`ditfuse.kernels.attention_sm90` and
:mod:`ditfuse.kernels.attention_sm90_fp32`, launched as :func:`ditfuse.ops.attention.launch`
launches them). Why each entry: docs/design/attention.md."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ditfuse.aot.compile import build_rows, compile_sm90
from ditfuse.norms import NormSpec
from ditfuse.ops import attention as A

# ---------------------------------------------------------------------------------------
# sm_90 builds on the CPU (no GPU): tensor-core instructions, registers, spills, smem


@dataclass(frozen=True)
class BuildSpec:
    """One production call, built for sm_90 as a real call would build it."""

    name: str
    dtype: str = "bf16"  # "bf16" | "fp16" | "fp32"
    H: int = 24
    D: int = 64
    N: int = 8704
    differential: bool = True
    prologue: bool = True  # DyT q/k norm + rotate-half RoPE over D/2 channels (SAME)
    window: object = 17
    trt: bool = False  # the seed's TensorRT contract: q/k of 2H heads [q1 | q2]
    gluon: bool = False  # the sm_90 Gluon kernel the call routes to (gluon_ok)
    precision: str = "high"  # fp32 products: "high" (tf32; the Gluon entries' form) or
    # "highest" (PyTorch's default: three-term tf32)


#: local memory a shipped build may touch outside its loops (bytes of spill / stack)
LOCAL_BYTES_MAX = 16

#: one attention (not differential) without the fused QK-norm + RoPE prologue
_PLAIN = dict(differential=False, prologue=False)

BUILD_SPECS = [
    BuildSpec("same-l-bf16"),
    BuildSpec("same-l-fp32", dtype="fp32"),
    BuildSpec("same-l-bf16-attn", prologue=False),
    BuildSpec("same-l-bf16-attn-gluon", prologue=False, gluon=True),
    BuildSpec("same-l-fp32-attn", dtype="fp32", prologue=False),
    BuildSpec("same-l-fp32-attn-highest", dtype="fp32", prologue=False, precision="highest"),
    BuildSpec("same-l-fp32-plain-highest", dtype="fp32", precision="highest", **_PLAIN),
    BuildSpec("same-l-fp32-attn-gluon", dtype="fp32", prologue=False, gluon=True),
    BuildSpec("same-l-trt-fp32", dtype="fp32", N=4352, prologue=False, trt=True),
    BuildSpec("same-l-trt-fp32-gluon", dtype="fp32", N=4352, prologue=False, trt=True, gluon=True),
    BuildSpec("same-l-fp32-plain", dtype="fp32", **_PLAIN),
    BuildSpec("sa3-dit-bf16-full", N=4096, window=-1),
    BuildSpec("d128-bf16-causal", D=128, N=4608, window=(-1, 0), **_PLAIN),
    BuildSpec("d128-fp32-diff-prologue", dtype="fp32", D=128, N=4096),
    BuildSpec("d32-fp16-window", dtype="fp16", D=32, N=4096, window=(8, 8), **_PLAIN),
    BuildSpec("d128-fp32-diff", dtype="fp32", D=128, N=8704, prologue=False),
    # head dims that are not a power of two: tiles padded to 128
    BuildSpec("d80-bf16-diff", D=80, N=4096, prologue=False),
    BuildSpec("d96-fp32-window", dtype="fp32", D=96, N=4096, window=(8, 8), **_PLAIN),
    BuildSpec("d48-fp32-diff", dtype="fp32", D=48, N=4096, prologue=False),  # padded to 64
]
BUILD_NAMES = [s.name for s in BUILD_SPECS]
#: the spec's fields a report row starts with
_SPEC_COLUMNS = ("name", "dtype", "H", "D", "N", "precision", "differential", "prologue")
_CHILD_ENV = "DITFUSE_ATTN_BUILD_CHILD"


def _meta_call(spec: BuildSpec):
    """The kernel launch of ``spec``'s call on meta tensors (views of the packed ``to_qkv``
    output, as SAME passes them): :func:`ditfuse.ops.attention.launch` of its plan with the
    table's settings, the prologue fused where ``spec`` has one (the specialization a call
    takes where :func:`ditfuse.ops.attention.prologue_apart` does not hold)."""
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[spec.dtype]
    H, D, N = spec.H, spec.D, spec.N
    meta = dict(device="meta", dtype=dt)
    if spec.trt:
        q12 = torch.empty(1, N, 2 * H, D, **meta)
        k12 = torch.empty(1, N, 2 * H, D, **meta)
        v = torch.empty(1, N, H, D, **meta)
        q1, q2, k1, k2 = q12[:, :, :H], q12[:, :, H:], k12[:, :, :H], k12[:, :, H:]
    else:
        buf = torch.empty(1, N, 5 * H * D, **meta)
        q1, q2, k1, k2, v = (t.unflatten(-1, (H, D)) for t in buf.chunk(5, -1))
    kw = {}
    if spec.differential:
        kw.update(q2=q2, k2=k2)
    if spec.prologue:

        def dyt():
            return NormSpec(
                "dyt",
                weight=torch.empty(D, **meta),
                bias=torch.empty(D, **meta),
                alpha=torch.empty(1, **meta),
                eps=None,
            )

        R = D // 2
        kw.update(
            q_norm=dyt(),
            k_norm=dyt(),
            cos=torch.empty(N, R, device="meta"),
            sin=torch.empty(N, R, device="meta"),
            rotary_dim=R,
        )

    def call():
        p = A.plan(q1, k1, v, spec.window, precision=spec.precision, **kw)
        A.launch(p, torch.empty(p.q.shape, **meta))  # run()'s (B, N, H, D) output

    return call


def capture_launch(spec: BuildSpec):
    """The (grid, args, kwargs) of ``spec``'s kernel launch (:func:`_meta_call`)."""
    from ditfuse.kernels import attention as attention_kernel
    from ditfuse.tools.inspect import intercept_launches

    device_test = A._gluon_device
    place = (attention_kernel, "_swa_fwd_kernel")
    if spec.gluon:  # the launch an sm_90 GPU takes (meta tensors stand in for its memory)
        from ditfuse.kernels import attention_sm90, attention_sm90_fp32

        A._gluon_device = lambda o4: True
        place = (
            (attention_sm90_fp32, "_swa_diff_fp32_sm90_kernel")
            if spec.dtype == "fp32"
            else (attention_sm90, "_swa_diff_sm90_kernel")
        )
    try:
        calls = intercept_launches([place], _meta_call(spec))
    finally:
        A._gluon_device = device_test
    if len(calls) != 1:
        raise RuntimeError(f"{spec.name}: expected one kernel launch, saw {len(calls)}")
    return calls[0]


def build(spec: BuildSpec) -> dict:
    """Compile ``spec`` for sm_90 (``triton.compile`` of Triton's own specialization of the
    captured launch), run the wheel's ``ptxas -v`` and ``cuobjdump``; count the tensor-core
    instructions in the PTX."""
    import re

    from ditfuse.kernels.attention import _swa_fwd_kernel as kernel
    from ditfuse.tools import inspect as ik

    source = None  # Triton's ASTSource
    if spec.gluon:
        from triton.experimental.gluon._runtime import GluonASTSource as source

        if spec.dtype == "fp32":
            from ditfuse.kernels.attention_sm90_fp32 import _swa_diff_fp32_sm90_kernel as kernel
        else:
            from ditfuse.kernels.attention_sm90 import _swa_diff_sm90_kernel as kernel
    grid, args, kwargs = capture_launch(spec)
    mma_sync = bool(kwargs.get("MMA_SYNC"))
    ck, (*_, options), pt = compile_sm90(kernel, args, kwargs, source, mma_sync)
    ptx = ck.asm["ptx"]
    sass = ik.run_cuobjdump(ck.asm["cubin"], ck.metadata.name)
    row = dict(
        **{k: getattr(spec, k) for k in _SPEC_COLUMNS},
        window=str(spec.window),
        block_m=kwargs["BLOCK_M"],
        block_n=kwargs["BLOCK_N"],
        step_m=kwargs["STEP_M"],
        num_warps=ck.metadata.num_warps,
        # the Gluon kernel has a buffer a key tile (TRIPS), no pipeline stages
        num_stages=kwargs["TRIPS"] if spec.gluon else kwargs["num_stages"],
        kernel="gluon" if spec.gluon else "triton",
        grid=list(grid),
        smem=ck.metadata.shared,
        wgmma=len(re.findall(r"\bwgmma\.mma_async\b", ptx)),
        mma=len(re.findall(r"\bmma\.sync\b", ptx)),
        **{k: pt[k] for k in ("regs", "spill_stores", "spill_loads", "stack")},
        ldl=sass["ldl"],
        stl=sass["stl"],
        cubin_local=sass["cubin_local"],
        sass_instructions=sass["sass_instructions"],
        loop_local=sass["loop_local"],
        enable_fp_fusion=options.enable_fp_fusion,
        maxnreg=options.maxnreg,
        arch=f"sm_{ik.ARCH}a",
    )
    bad = []
    if not (row["wgmma"] or row["mma"]):
        bad.append("no mma/wgmma in the PTX")
    # local memory only outside the key loop, a few bytes a program (a one-warp fp32 entry
    # kept one 4-byte value across its loop: LDL / STL before and after)
    if row["loop_local"]:
        bad.append(f"{row['loop_local']} LDL / STL inside a loop")
    if max(row["spill_stores"], row["spill_loads"], row["stack"]) > LOCAL_BYTES_MAX:
        bad.append(
            f"spills {row['spill_stores']} B / {row['spill_loads']} B, stack "
            f"{row['stack']} B (at most {LOCAL_BYTES_MAX} B, outside loops)"
        )
    row["violations"] = bad + ik.smem_violations(row["smem"])
    return row


def build_report(names=None) -> list:
    """One row per :data:`BUILD_SPECS` entry (``names`` selects). Compiles in a
    ``TRITON_INTERPRET=0`` subprocess when this process runs the interpreter."""
    return build_rows("ditfuse.tools.inspect_attention", BUILD_SPECS, build, _CHILD_ENV, names)
