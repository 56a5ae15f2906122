"""Session 28: ptxas's wgmma serialization in the session 27 Gluon kernel, and its fixes.

ptxas -v on the s27 kernel (``gluon_s28/k_s27.py``) reports C7514 "wgmma.mma_async
instructions are serialized due to non wgmma instructions reading accumulator registers of a
wgmma between start and end of the pipeline stage": its SASS waits on every HGMMA right
after issuing it (12 ``WARPGROUP.DEPBAR.LE gsb0, 0x0``), so the hand-placed waits of the PTX
never overlapped anything. The culprit: P @ V products left in flight across the loop's back
edge, whose accumulators the next trip rescales after the wait that retires them. Variants,
all the same arithmetic (bitwise the Triton kernel expected):

* ``s27``          -- the shipped s27 loop (serialized by ptxas)
* ``wait0``        -- the loop, every trip ending with wait(0) (ptxas pipelines it: S2 under
                      softmax 1, P1 @ V under softmax 2). Call b ran it as ``loop_wait0``
                      with one more wait(0) after the loop (``k_loop_wait0.py`` at commit
                      a3b0d94), the same SASS but for that wait
* ``loop_top``     -- and the ring's refill issued at the trip's top (after its barrier)
* ``unroll``       -- ``TRIPS`` trips unrolled (``gluon_s28/k_unroll.py``), P @ V of trip t in flight
                      under trip t+1's score products (181 registers: 2 programs an SM)
* ``unroll168``    -- the same capped at 168 registers (3 programs an SM; 36 B of spills)
* ``rowptr``       -- ``wait0`` with each tensor's tile-0 row pointers computed once and
                      advanced by a tile step (``library`` in calls d and e)
* ``library``      -- ``_attn_gluon`` as shipped (v12: ``tma3_128``'s kernel, the library's
                      own launch: TMA descriptors, ``TRIPS``, 128 registers)
(Built on the CPU only: the next tile's cp.async wait and barrier placed before the trip's
last wait, while P @ V runs, ``gluon_s28/k_sync_early.py``: ptxas 12.9 crashes on it, -11.)
* ``library_3st``  -- ``rowptr`` with a 3-deep ring
* ``unroll_w0``    -- ``TRIPS`` unrolled, each trip ending with wait(0) (as ``library``)
* ``unroll_sync``  -- unrolled, trip t-1's P @ V retired after trip t's cp.async wait and
                      barrier (they run under it); only TRIPS ring buffers where every tile
                      is copied before the first trip (52 KB at SAME-L: 4 programs an SM fit)
* ``unroll_sync128`` -- the same capped at 128 registers (4 programs an SM; 32 B of spills)
* ``tma``          -- ``library`` with Q / K / V tiles copied by TMA (one thread issues a
                      tile's three copies; an mbarrier a ring stage instead of cp.async
                      groups and a block barrier a trip; host descriptors of the 4-D views)
* ``tma_3st_128``  -- ``tma`` with a 3-deep ring at 128 registers (4 programs an SM)
* ``tma2_3st_128`` -- and an mbarrier a tensor a stage (K1, K2, V; Q1, Q2): Gluon's barrier
                      analysis then puts fewer block barriers between the copies
* ``tma3`` / ``tma3_128`` -- ``tma2`` with a buffer a key tile (``TRIPS`` of them, all copied
                      before the first trip; no ring, no refill), uncapped / at 128 registers:
                      the library's kernel since (``k_tma3.py`` at commit 54a93e2, which call e
                      measured; the library's build has the same SASS main body)

    PYTHONPATH=src python benchmarks/attn_gluon_s28_ab.py [--rounds 5] [--variants a,b]  # H200
    PYTHONPATH=src python benchmarks/attn_gluon_s28_ab.py --build [--variants a,b]  # CPU
"""
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import torch

import ditfuse
from ditfuse import attention, _attn_gluon as ag, _attn_kernel
from ditfuse.inspect_kernels import intercept_launches

HERE = Path(__file__).resolve().parent
CASES = [("same-l-8704", 8704, torch.bfloat16), ("same-l-32946", 32946, torch.bfloat16),
         ("same-l-trt-shape", 4352, torch.bfloat16), ("same-l-8704-fp16", 8704, torch.float16),
         ("batch2-odd", 1000, torch.bfloat16)]


def _load(name):
    spec = importlib.util.spec_from_file_location(f"gluon_s28_{name}", HERE / "gluon_s28" /
                                                  f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._swa_diff_sm90_kernel


VARIANTS = {  # name: (kernel, extra launch options)
    "s27": (lambda: _load("k_s27"), {}),
    "loop_top": (lambda: _load("k_loop_wait0_top"), {}),
    "unroll": (lambda: _load("k_unroll"), {}),
    "unroll168": (lambda: _load("k_unroll"), {"maxnreg": 168}),
    "wait0": (lambda: _load("k_wait0"), {}),
    "rowptr": (lambda: _load("k_rowptr"), {}),
    "library": (lambda: ag._swa_diff_sm90_kernel, {"_lib": True}),
    "library_3st": (lambda: _load("k_rowptr"), {"STAGES": 3}),
    "library_3st_128": (lambda: _load("k_rowptr"), {"STAGES": 3, "maxnreg": 128}),
    "unroll_w0": (lambda: _load("k_unroll_w0"), {}),
    "unroll_sync": (lambda: _load("k_unroll_sync"), {}),
    "unroll_sync128": (lambda: _load("k_unroll_sync"), {"maxnreg": 128}),
    "tma": (lambda: _load("k_tma"), {"_tma": True}),
    "tma_3st_128": (lambda: _load("k_tma"), {"_tma": True, "STAGES": 3, "maxnreg": 128}),
    "tma2_3st_128": (lambda: _load("k_tma2"), {"_tma": True, "STAGES": 3, "maxnreg": 128}),
    "tma3_128": (lambda: ag._swa_diff_sm90_kernel, {"_lib": True}),
    "tma3": (lambda: ag._swa_diff_sm90_kernel, {"_lib": True, "maxnreg": None}),
}


def _args(args, extra):
    """The launch's arguments; TMA descriptors of the five (B, N, H, D) operands for the
    ``tma`` variant (blocks of one head's BLOCK_M / BLOCK_N tokens, 128-byte swizzle)."""
    if not extra.get("_tma"):
        return args
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    import triton.experimental.gluon.language as gl
    lay = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=4)
    descs = [TensorDescriptor(t, list(t.shape), list(t.stride()),
                              [1, ag.BLOCK_M if i in (0, 3) else ag.BLOCK_N, 1, t.shape[3]],
                              lay) for i, t in enumerate(args[:5])]
    return (*descs, *args[5:])


def _views(name, N, dt, device):
    B, H = (2, 5) if name == "batch2-odd" else (1, 24)
    if device == "meta":
        proj = torch.empty(B, N, 5 * H * 64, dtype=dt, device="meta")
    else:
        g = torch.Generator(device=device).manual_seed(0)
        proj = torch.randn(B, N, 5 * H * 64, generator=g, device=device).to(dt)
    return [t.unflatten(-1, (H, 64)) for t in proj.chunk(5, dim=-1)]


def _launch_spec(q1, k1, v, q2, k2):
    """The library's launch (grid, args, kwargs) and the same launch in session 27's
    argument form (the five operand views and every stride: the prototypes' signature)."""
    call = lambda: ditfuse.sliding_window_attention(q1, k1, v, 17, q2=q2, k2=k2)
    (grid, args, kw), = intercept_launches([(ag, "_swa_diff_sm90_kernel"),
                                            (_attn_kernel, "_swa_fwd_kernel")], call)
    views = [d.base for d in args[:5]]  # the library passes TMA descriptors of the views
    old = (*views, *args[5:12], *[st for t in views for st in t.stride()[:3]], *args[12:])
    kw_old = {k: v for k, v in kw.items() if k not in ("TRIPS", "maxnreg")}
    kw_old["STAGES"] = 4  # session 27's ring depth
    return grid, (args, kw), (old, kw_old)


def _spec_for(extra, lib, old):
    """The library's own launch for ``library``; the session 27 form for the prototypes."""
    return lib if extra.get("_lib") else old


def _kw(kern, args, kw, extra):
    kw = {k: v for k, v in kw.items() if not k.isupper() or k in kern.arg_names}
    extra = {k: v for k, v in extra.items() if not k.startswith("_")}
    if "TRIPS" in kern.arg_names and "TRIPS" not in kw:  # prototypes: N, LEFT, RIGHT = args 9-11
        kw["TRIPS"] = max(1, -(-min(kw["STEP_M"] + args[10] + args[11], args[9]) // 32))
    return {**kw, **extra}


def build():
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from ditfuse.inspect_kernels import specialize, run_ptxas, run_cuobjdump
    attention._gluon_device = lambda o4: True
    t = GPUTarget("cuda", 90, 32)
    grid, lib, old = _launch_spec(*_views("same-l-8704", 8704, torch.bfloat16, "meta"))
    only = sys.argv[sys.argv.index("--variants") + 1].split(",") if "--variants" in sys.argv \
        else list(VARIANTS)
    for name, (kern, extra) in VARIANTS.items():
        if name not in only:
            continue
        kern = kern()
        args, kw = _spec_for(extra, lib, old)
        sig, cex, attrs, opts = specialize(kern, _args(args, extra), _kw(kern, args, kw, extra), t)
        ck = triton.compile(GluonASTSource(kern, sig, cex, attrs), target=t,
                            options=opts.__dict__)
        pt = run_ptxas(ck.asm["ptx"], opts, ck.metadata.name)
        cu = run_cuobjdump(ck.asm["cubin"], ck.metadata.name)
        from ditfuse.inspect_kernels import wheel_tool_path
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "k.cubin").write_bytes(ck.asm["cubin"])
            sass = subprocess.run([str(wheel_tool_path("cuobjdump")), "--dump-sass",
                                   str(Path(d) / "k.cubin")], capture_output=True,
                                  text=True).stdout
        print(json.dumps(dict(
            variant=name, regs=pt["regs"], spills=pt["spill_stores"], shared=ck.metadata.shared,
            sass=cu["sass_instructions"],
            serialized=any("C7514" in ln for ln in pt["ptxas_log"]),
            hgmma=sass.count("HGMMA."),
            depbar_0=sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x0"),
            depbar_1=sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1"),
            bar_sync=len(re.findall(r"BAR\.SYNC", sass)))), flush=True)


def main():
    from ditfuse.bench import graph_us
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 5
    only = sys.argv[sys.argv.index("--variants") + 1].split(",") if "--variants" in sys.argv \
        else list(VARIANTS)
    kernels = {n: (k(), e) for n, (k, e) in VARIANTS.items() if n in only}
    for name, N, dt in CASES:
        q1, q2, k1, k2, v = _views(name, N, dt, "cuda")
        attention.GLUON_SM90 = False
        ref = ditfuse.sliding_window_attention(q1, k1, v, 17, q2=q2, k2=k2)
        t_triton = []
        attention.GLUON_SM90 = True
        grid, lib, old = _launch_spec(q1, k1, v, q2, k2)
        o = old[0][5]
        times = {n: [] for n in kernels}
        same = {}
        for r in range(rounds):
            for n, (kern, extra) in kernels.items():
                args, kw = _spec_for(extra, lib, old)
                a_ = _args(args, extra)
                launch = lambda: kern[grid](*a_, **_kw(kern, args, kw, extra))
                if r == 0:
                    o.fill_(float("nan"))
                    launch()
                    torch.cuda.synchronize()
                    same[n] = torch.equal(o.view(torch.int16), ref.view(torch.int16))
                times[n].append(graph_us(launch))
            attention.GLUON_SM90 = False
            t_triton.append(graph_us(
                lambda: ditfuse.sliding_window_attention(q1, k1, v, 17, q2=q2, k2=k2)))
            attention.GLUON_SM90 = True
        print(f"{name:18s} {str(dt)[6:]:8s} triton {min(t_triton):6.1f} | " + " | ".join(
            f"{n} {min(ts):6.1f} ({max(ts):.1f}) {'bitwise' if same[n] else 'DIFFERS'}"
            for n, ts in times.items()), flush=True)


if __name__ == "__main__":
    build() if "--build" in sys.argv else main()
