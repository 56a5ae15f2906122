"""Instruction-issue estimate of the GroupNorm / channel-RMS kernels at a registry shape,
from their sm_90 SASS (no GPU: ``triton.compile`` + the wheel's cuobjdump; session 6).

For each kernel a call at the shape launches (captured on meta tensors): registers, SASS
instructions of one program, the most frequent opcodes, and the time the H200 needs just
to issue them: programs x threads x instructions / 32 lanes / (132 SMs x 4 schedulers x
1.98 GHz), one warp instruction per scheduler per cycle (straight-line kernels; a loop body
is counted once, so for the statistics kernel the estimate is a lower bound). Compare it
with the measured time (``diag_gn_passes.py``): close to it, the kernel is issue-bound.

    TRITON_INTERPRET=0 PYTHONPATH=src python benchmarks/sass_count.py [SHAPE ...]
"""
import collections
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from ditfuse import group_norm as gn
from ditfuse.inspect_kernels import intercept_launches, run_ptxas, specialize, wheel_tool_path
from ditfuse.shapes import GN_SHAPES

ISSUE_PER_S = 132 * 4 * 1.98e9  # warp instructions a second, H200 (SXM) at its max clock


def count(kernel, grid, args, kw, label):
    """Registers, SASS instructions of one program and the time to issue them all."""
    target = GPUTarget("cuda", 90, 32)
    sig, cex, attrs, opts = specialize(kernel, args, kw, target)
    ck = triton.compile(ASTSource(kernel, sig, cex, attrs), target=target,
                        options=opts.__dict__)
    pt = run_ptxas(ck.asm["ptx"], opts, ck.metadata.name)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"])
        f.flush()
        sass = subprocess.run([str(wheel_tool_path("cuobjdump")), "-sass", f.name],
                              capture_output=True, text=True, check=True).stdout
    ins = [ln for ln in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln)]
    ops = collections.Counter(
        re.sub(r"^\s+/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?", "", ln).split()[0].split(".")[0]
        for ln in ins)
    programs = 1
    for g in grid:
        programs *= g
    nw = ck.metadata.num_warps
    return dict(shape=label[0], kernel=label[1], programs=programs, num_warps=nw,
                regs=pt["regs"], sass=len(ins),
                issue_us=programs * nw * len(ins) / ISSUE_PER_S * 1e6,
                top=ops.most_common(10))


def qk_rows(names=("flux1", "flux2", "qwen-image")):
    """QK-norm + RoPE at the shipped specializations of ``ditfuse inspect``."""
    from ditfuse.inspect_kernels import SPECS, capture_launch, qk_kernel_of

    for spec in SPECS:
        if spec.name in names:
            grid, args, kw = capture_launch(spec)
            kernel = qk_kernel_of(kw)
            yield count(kernel, grid, args, kw, (spec.name, kernel.fn.__name__))


def adaln_rows(dtype=torch.bfloat16):
    """AdaLN modulate / gated residual + modulate at FLUX.1 and FLUX.2 (4608 tokens)."""
    from ditfuse import adaln

    def meta(*s):
        return torch.empty(*s, dtype=dtype, device="meta")

    for label, D in (("flux1", 3072), ("flux2", 6144)):
        calls = {
            "modulate": lambda D=D: adaln.adaln_modulate(meta(1, 4608, D), meta(1, D),
                                                         meta(1, D), rounding="per_op"),
            "gated+modulate": lambda D=D: adaln.gated_residual_adaln(
                meta(1, 4608, D), meta(1, 4608, D), meta(1, D), meta(1, D), meta(1, D),
                rounding="per_op"),
        }
        for what, call in calls.items():
            launches = intercept_launches([(adaln, "_adaln_tile_kernel"),
                                           (adaln, "_adaln_kernel")], call)
            for grid, args, kw in launches:
                kernel = adaln._adaln_tile_kernel if "ROWS" in kw else adaln._adaln_kernel
                yield count(kernel, grid, args, kw, (f"{label} {what}", kernel.fn.__name__))


def sass_rows(name: str, dtype=torch.bfloat16):
    sh = GN_SHAPES[name]
    C = sh.shape[1]

    def meta(*s):
        return torch.empty(*s, dtype=dtype, device="meta")

    if sh.op == "rms":
        ps = (C,) + (1,) * (len(sh.shape) - 2)
        kernels = ["_rms_ch_kernel"]

        def call():
            gn.rms_norm_silu_channels(meta(*sh.shape), meta(*ps), meta(*ps))
    else:
        kernels = ["_gn_fit_kernel", "_gn_stats_kernel", "_gn_apply_kernel"]

        def call():
            gn.group_norm_silu(meta(*sh.shape), sh.groups, meta(C), meta(C), 1e-6)
    launches = intercept_launches([(gn, k) for k in kernels], call)  # in launch order
    if sh.op == "gn":  # the fit path's one kernel, or the split path's two
        names = kernels[:1] if len(launches) == 1 else kernels[1:]
    else:
        names = kernels
    for kname, (grid, args, kw) in zip(names, launches):
        yield count(getattr(gn, kname), grid, args, kw, (name, kname))


if __name__ == "__main__":
    import itertools

    flags = [a for a in sys.argv[1:] if a.startswith("--")]
    shapes = [a for a in sys.argv[1:] if not a.startswith("--")]
    if not flags and not shapes:
        shapes = ["flux-vae-out-1024", "wan-vae-out-480p"]
    gens = ([qk_rows()] if "--qk" in flags else []) + \
        ([adaln_rows()] if "--adaln" in flags else []) + [sass_rows(n) for n in shapes]
    for r in itertools.chain(*gens):
        print(f"{r['shape']:24s} {r['kernel']:26s} {r['programs']:6d} programs x "
              f"{r['num_warps']} warps, {r['regs']} regs, {r['sass']} SASS instructions: "
              f"{r['issue_us']:.0f} us to issue")
        print("   ", r["top"])
