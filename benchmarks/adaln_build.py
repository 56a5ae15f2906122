"""sm_90 builds of the AdaLN tile kernel (no GPU): registers, spills and resident warps an SM
for the FLUX / Wan modulate and gated calls under several (rows, num_warps).

    TRITON_INTERPRET=0 PYTHONPATH=src python benchmarks/adaln_build.py [D,...]
"""
import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import ditfuse
from ditfuse import adaln
from ditfuse import inspect_kernels as ik


def build(D, op, cfg, dtype=torch.bfloat16):
    x = torch.empty(1, 4608, D, dtype=dtype, device="meta")
    e = torch.empty(1, 6, D, dtype=dtype, device="meta")
    shift, scale, gate = e[:, 0], e[:, 1], e[:, 2]
    adaln.TILE_SETTINGS = cfg
    try:
        if op == "modulate":
            call = lambda: ditfuse.adaln_modulate(x, shift, scale, eps=1e-6, rounding="per_op")  # noqa: E731
        else:
            call = lambda: ditfuse.gated_residual_adaln(x, x, gate, shift, scale, eps=1e-6,  # noqa: E731
                                                        rounding="per_op")
        calls = ik.intercept_launches([(adaln, "_adaln_tile_kernel")], call)
    finally:
        adaln.TILE_SETTINGS = None
    grid, args, kwargs = calls[0]
    target = GPUTarget("cuda", ik.ARCH, ik.WARP_SIZE)
    kernel = adaln._adaln_tile_kernel
    sig, cex, attrs, opts = ik.specialize(kernel, args, kwargs, target)
    ck = triton.compile(ASTSource(kernel, sig, cex, attrs), target=target, options=opts.__dict__)
    p = ik.run_ptxas(ck.asm["ptx"], opts, ck.metadata.name)
    warps = ik.occupancy_warps(p["regs"], ck.metadata.num_warps, ck.metadata.shared)
    return p["regs"], p["spill_stores"], ck.metadata.num_warps, warps


for D in [int(v) for v in (sys.argv[1].split(",") if len(sys.argv) > 1 else ["3072", "5120", "6144"])]:
    for op in ("modulate", "gated"):
        for cfg in [(1, 2), (1, 4), (1, 8)]:
            regs, spill, nw, warps = build(D, op, cfg)
            print(f"D {D:5d} {op:9s} rows,warps={cfg}: {regs:3d} registers, spill {spill}, "
                  f"{warps} warps an SM ({warps // nw} programs)", flush=True)
