"""Session 28: the Gluon SAME-L entry with and without the warp skip
(``attention.GLUON_WARP_SKIP``: a warp whose 16 query rows' band misses a key tile skips
both softmaxes of that trip and feeds P = 0 to the warpgroup's P @ V -- the same bits).

    PYTHONPATH=src python benchmarks/attn_warp_skip.py --build    # CPU: both sm_90 builds
    PYTHONPATH=src python benchmarks/attn_warp_skip.py [--rounds 5]   # H200: bitwise + time

Ran against commit aecbf8e (``logs/s28/a``; LOST: 63.8 against 58.8 us), whose library had
the ``GLUON_WARP_SKIP`` flag and the kernel's ``WARP_SKIP`` branch; both were removed after
the measurement, so this script runs only at that commit. The GPU run alternates the variants (and the Triton kernel, GLUON_SM90 off) round by round
at the four SAME-L 16-bit differential shapes, CUDA-graph replay (min of ``graph_us``), and
compares the three outputs bit for bit.
"""
import json
import re
import sys

import torch

import ditfuse
from ditfuse import attention

CASES = [("same-l-8704", 8704, torch.bfloat16), ("same-l-32946", 32946, torch.bfloat16),
         ("same-l-trt-shape", 4352, torch.bfloat16), ("same-l-8704-fp16", 8704, torch.float16)]


def _views(N, dt, device, B=1, H=24):
    g = torch.Generator(device="cpu" if device == "meta" else device).manual_seed(0)
    if device == "meta":
        proj = torch.empty(B, N, 5 * H * 64, dtype=dt, device="meta")
    else:
        proj = torch.randn(B, N, 5 * H * 64, generator=g, device=device).to(dt)
    return [t.unflatten(-1, (H, 64)) for t in proj.chunk(5, dim=-1)]


def build():
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from ditfuse import _attn_gluon as ag, _attn_kernel
    from ditfuse.inspect_kernels import (intercept_launches, specialize, run_ptxas,
                                         run_cuobjdump)
    attention._gluon_device = lambda o4: True
    t = GPUTarget("cuda", 90, 32)
    q1, q2, k1, k2, v = _views(8704, torch.bfloat16, "meta")
    for skip in (False, True):
        attention.GLUON_WARP_SKIP = skip
        call = lambda: ditfuse.sliding_window_attention(q1, k1, v, 17, q2=q2, k2=k2)
        (grid, args, kw), = intercept_launches([(ag, "_swa_diff_sm90_kernel"),
                                                (_attn_kernel, "_swa_fwd_kernel")], call)
        sig, cex, attrs, opts = specialize(ag._swa_diff_sm90_kernel, args, kw, t)
        ck = triton.compile(GluonASTSource(ag._swa_diff_sm90_kernel, sig, cex, attrs),
                            target=t, options=opts.__dict__)
        ptx = ck.asm["ptx"]
        pt = run_ptxas(ptx, opts, ck.metadata.name)
        cu = run_cuobjdump(ck.asm["cubin"], ck.metadata.name)
        print(json.dumps(dict(
            warp_skip=skip, regs=pt["regs"], spills=pt["spill_stores"], shared=ck.metadata.shared,
            sass=cu["sass_instructions"], bar_sync=len(re.findall(r"bar\.sync", ptx)),
            ex2=ptx.count("ex2.approx"), tid=ptx.count("%tid.x"),
            waits=re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx))), flush=True)


def main():
    from ditfuse.bench import graph_us
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 5
    variants = [("skip", True, True), ("gluon", True, False), ("triton", False, True)]
    for name, N, dt in CASES:
        q1, q2, k1, k2, v = _views(N, dt, "cuda")
        call = lambda: ditfuse.sliding_window_attention(q1, k1, v, 17, q2=q2, k2=k2)
        outs, times = {}, {n: [] for n, *_ in variants}
        for r in range(rounds):
            for vn, g, s in variants:
                attention.GLUON_SM90, attention.GLUON_WARP_SKIP = g, s
                if r == 0:
                    outs[vn] = call()
                times[vn].append(graph_us(call))
        attention.GLUON_SM90, attention.GLUON_WARP_SKIP = True, True
        bits = lambda a: a.view(torch.int16)
        same = [torch.equal(bits(outs["skip"]), bits(outs[o])) for o in ("gluon", "triton")]
        print(f"{name:18s} {str(dt)[6:]:8s} " + " | ".join(
            f"{vn} min {min(ts):6.1f} ({' '.join(f'{x:.1f}' for x in ts)})"
            for vn, ts in times.items()) + f" | bitwise gluon {same[0]} triton {same[1]}",
            flush=True)


if __name__ == "__main__":
    build() if "--build" in sys.argv else main()
