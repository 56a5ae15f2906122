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
    target = GPUTarget("cuda", 90, 32)
    for kname, (grid, args, kw) in zip(names, launches):
        kernel = getattr(gn, kname)
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
        programs = grid[0] * (grid[1] if len(grid) > 1 else 1)
        issue_us = programs * 32 * kw["num_warps"] * len(ins) / 32 / ISSUE_PER_S * 1e6
        yield dict(shape=name, kernel=kname, programs=programs, num_warps=kw["num_warps"],
                   regs=pt["regs"], sass=len(ins), issue_us=issue_us,
                   top=ops.most_common(10))


if __name__ == "__main__":
    for name in sys.argv[1:] or ["flux-vae-out-1024", "wan-vae-out-480p"]:
        for r in sass_rows(name):
            print(f"{r['shape']:18s} {r['kernel']:18s} {r['programs']:6d} programs x "
                  f"{r['num_warps']} warps, {r['regs']} regs, {r['sass']} SASS instructions: "
                  f"{r['issue_us']:.0f} us to issue")
            print("   ", r["top"])
