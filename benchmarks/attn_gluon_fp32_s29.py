"""Session 29: SAME-L's fp32 differential entry in Gluon with tf32 wgmma
(``ditfuse._attn_gluon_fp32``) against the shipped Triton fp32 entry (two-warp mma.sync).

Variants:

* ``kernel``   -- ``_attn_gluon_fp32``'s kernel as the library ships it, launched directly;
                  ``kernel_hm`` with the head-major grid (a few heads' tiles at once)
* ``ring_168`` -- a 72 KB form (3 programs an SM): one K1 / K2 buffer refilled once every
                  warp's score products are done, two raw V buffers, one transposed V
                  (``gluon_s29/k_ring.py``)
* ``persist``  -- a persistent form (``gluon_s29/k_persist.py``): 2 programs an SM loop
                  over the tiles, the next tile's copies issued as its buffers free up;
                  tiles token-major (every head of a few query tiles at once), ``persist_hm``
                  head-major (call e's ``persist``)
* ``reg3``     -- 72 KB (3 programs an SM) with every copy a trip ahead: a two-slot K1 / K2
                  TMA ring and V's tile loaded into registers a trip ahead
                  (``gluon_s29/k_reg3.py``)
* ``diag_math`` / ``diag_mem`` -- timing only (``gluon_s29/k_diag.py``): the kernel with
                  every program's copies reading the first program's tiles (L2 hits: the
                  math with little DRAM traffic), and the copies and stores without the math;
                  ``diag_nocopy``: no copies or waits at all (the math and the stores)

Calls a and b (``logs/s29``) ran the prototype at commit b64d26d (``VT_BUFS`` 1 or 2
transposed-V buffers, uncapped or capped at 168: ``vt1``, ``vt2``, ``vt1_168``, ``vt2_168``);
the library keeps ``vt1_168``. ``library`` is the public call (the Gluon route), ``triton``
the same call with ``attention.GLUON_SM90`` off (the Triton fp32 entry).

GPU: each variant's output against the fp64 formula (``ACCURACY[fp32]`` share, as the
library's fp32 gate) and against the Triton entry's, every element written (NaN-poisoned
output), then CUDA-graph times (min / max of alternating rounds) at the TensorRT contract
(1, 4352, 24 x 2, 64), SAME-L 8704 and 32946, and awkward cases (batch 2 with 5 heads,
asymmetric windows, N below a tile).

    PYTHONPATH=src python benchmarks/attn_gluon_fp32_s29.py            # H200
    PYTHONPATH=src python benchmarks/attn_gluon_fp32_s29.py --build    # CPU: sm_90 builds
"""
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import ditfuse
from ditfuse import attention, reference, _attn_gluon_fp32 as af

HERE = Path(__file__).resolve().parent

VARIANTS = {"kernel": dict(maxnreg=af.MAXNREG),
            "kernel_hm": dict(maxnreg=af.MAXNREG, TOKEN_MAJOR=False),
            "ring_168": dict(VT_BUFS=1, maxnreg=168, _kernel="k_ring"),
            # timing only (wrong outputs by design): the math with every copy an L2 hit, and
            # the copies and stores without the math
            "diag_math": dict(MODE=1, maxnreg=168, _kernel="k_diag", _timing_only=True),
            "diag_mem": dict(MODE=2, maxnreg=168, _kernel="k_diag", _timing_only=True),
            "diag_nocopy": dict(MODE=3, maxnreg=168, _kernel="k_diag", _timing_only=True),
            "persist_hm": dict(maxnreg=168, _kernel="k_persist", _persistent=True,
                               TOKEN_MAJOR=False),
            "persist": dict(maxnreg=168, _kernel="k_persist", _persistent=True),
            "reg3": dict(maxnreg=168, _kernel="k_reg3", _v_ptr=True)}
if "--variants" in sys.argv:
    VARIANTS = {k: v for k, v in VARIANTS.items()
                if k in sys.argv[sys.argv.index("--variants") + 1].split(",")}


def kernel(extra):
    """The library's prototype kernel, or a session 29 variant's (``gluon_s29/<name>.py``)."""
    name = extra.get("_kernel")
    if not name:
        return af._swa_diff_fp32_sm90_kernel
    spec = importlib.util.spec_from_file_location(f"gluon_s29_{name}", HERE / "gluon_s29" /
                                                  f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._swa_diff_fp32_sm90_kernel
TIMED = [("trt-4352", 1, 4352, 24, (17, 17)), ("same-l-8704", 1, 8704, 24, (17, 17)),
         ("same-l-32946", 1, 32946, 24, (17, 17))]
CHECKED = TIMED + [("batch2-odd", 2, 1000, 5, (17, 17)), ("asym-3-20", 1, 700, 3, (3, 20)),
                   ("asym-31-32", 1, 500, 2, (31, 32)), ("win0", 1, 300, 2, (0, 0)),
                   ("short-40", 1, 40, 3, (17, 17)), ("one", 1, 1, 2, (17, 17))]


def views(B, N, H, device, seed=0):
    """SAME's packed to_qkv output (B, N, 5 H 64) cut into q1, q2, k1, k2, v views."""
    if device == "meta":
        proj = torch.empty(B, N, 5 * H * 64, device="meta")
    else:
        g = torch.Generator(device=device).manual_seed(seed)
        proj = torch.randn(B, N, 5 * H * 64, generator=g, device=device)
    return [t.unflatten(-1, (H, 64)) for t in proj.chunk(5, dim=-1)]


def launch_args(q1, q2, k1, k2, v, window, o, lam=0.8, extra=None):
    B, N, H, D = q1.shape
    left, right = min(window[0], N), min(window[1], N)
    step = attention.query_step(af.BLOCK_M, af.BLOCK_N, left, right)
    descs = [af.descriptor(t, r) for t, r in
             zip((q1, k1, v, q2, k2), (af.BLOCK_M, af.BLOCK_N, af.BLOCK_N, af.BLOCK_M,
                                       af.BLOCK_N))]
    args = (*descs, o, q1, lam, D ** -0.5 * attention.LOG2E, N, left, right, *o.stride()[:3], 0)
    kw = dict(H=H, D=D, BLOCK_M=af.BLOCK_M, BLOCK_N=af.BLOCK_N, STEP_M=step,
              TRIPS=af.max_trips(N, left, right, step), LAM_PTR=False, TOKEN_MAJOR=True,
              num_warps=af.NUM_WARPS, enable_fp_fusion=False)
    kw.update({k: v for k, v in (extra or {}).items() if not k.startswith("_")})
    grid = (B * H, -(-N // step)) if kw["TOKEN_MAJOR"] else (-(-N // step), B * H)
    if (extra or {}).get("_v_ptr"):  # V read by plain loads: its pointer and strides
        args = (*args, v, v.stride(0), v.stride(1), v.stride(2))
    if (extra or {}).get("_persistent"):  # 2 programs an SM looping over head-major tiles
        n_m = -(-N // step)
        args = (*args, n_m, B * H * n_m, B * H)
        grid = (min(B * H * n_m, 2 * _sms()),)
    return grid, args, kw


def _sms():
    return torch.cuda.get_device_properties(0).multi_processor_count \
        if torch.cuda.is_available() else 132


def build():
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    from ditfuse.inspect_kernels import specialize, run_ptxas, wheel_tool_path
    t = GPUTarget("cuda", 90, 32)
    q1, q2, k1, k2, v = views(1, 4352, 24, "meta")
    o = torch.empty(1, 4352, 24, 64, device="meta")
    for name, extra in VARIANTS.items():
        kern = kernel(extra)
        grid, args, kw = launch_args(q1, q2, k1, k2, v, (17, 17), o, extra=extra)
        sig, cex, attrs, opts = specialize(kern, args, kw, t)
        ck = triton.compile(GluonASTSource(kern, sig, cex, attrs), target=t,
                            options=opts.__dict__)
        pt = run_ptxas(ck.asm["ptx"], opts, ck.metadata.name)
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "k.cubin").write_bytes(ck.asm["cubin"])
            sass = subprocess.run([str(wheel_tool_path("cuobjdump")), "--dump-sass",
                                   str(Path(d) / "k.cubin")], capture_output=True,
                                  text=True).stdout
        if "--dump" in sys.argv:
            Path(f"/tmp/fp32_{name}.sass").write_text(sass)
            Path(f"/tmp/fp32_{name}.ptx").write_text(ck.asm["ptx"])
            Path(f"/tmp/fp32_{name}.ttgir").write_text(ck.asm["ttgir"])
        print(json.dumps(dict(
            variant=name, regs=pt["regs"], spills=pt["spill_stores"], shared=ck.metadata.shared,
            sass=len(re.findall(r"^\s*/\*[0-9a-f]{4}\*/", sass, re.M)),
            serialized=[ln for ln in pt["ptxas_log"] if "C75" in ln],
            hgmma=sass.count("HGMMA."), utmaldg=sass.count("UTMALDG"),
            depbar_0=sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x0"),
            depbar_1=sass.count("WARPGROUP.DEPBAR.LE gsb0, 0x1"),
            bar_sync=len(re.findall(r"BAR\.SYNC", sass)),
            tma_block=[m.get("block_size") for m in (ck.metadata.tensordesc_meta or [])][:2])),
            flush=True)


def main():
    from ditfuse.bench import graph_us
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 5
    kerns = {n: kernel(e) for n, e in VARIANTS.items()}
    tol = attention.ACCURACY[torch.float32]
    for name, B, N, H, window in CHECKED:
        q1, q2, k1, k2, v = views(B, N, H, "cuda")
        attention.GLUON_SM90 = False  # the Triton entry's output, for comparison
        lib = ditfuse.sliding_window_attention(q1, k1, v, window, q2=q2, k2=k2, lam=0.8)
        attention.GLUON_SM90 = True
        ref = None
        if N <= 8704:
            ref = reference.sliding_window_attention_reference(
                q1, k1, v, window, q2=q2, k2=k2, lam=0.8, compute_dtype=torch.float64).double()
        res = []
        for vname, extra in VARIANTS.items():
            if extra.get("_timing_only"):
                continue
            o = torch.full((B, N, H, 64), float("nan"), device="cuda")
            grid, args, kw = launch_args(q1, q2, k1, k2, v, window, o, extra=extra)
            kerns[vname][grid](*args, **kw)
            torch.cuda.synchronize()
            msg = f"{vname}: nan {int(o.isnan().sum())}"
            d_lib = (o - lib).abs().max().item()
            msg += f" |d lib| {d_lib:.2e}"
            if ref is not None:
                scale = ref.abs() + (1 + 0.8) * v.double().pow(2).mean().sqrt()
                msg += f" err/tol {((o.double() - ref).abs() / scale).max().item() / tol:.3f}"
                msg += f" (lib {((lib.double() - ref).abs() / scale).max().item() / tol:.3f})"
            res.append(msg)
        print(f"{name:14s} " + " | ".join(res), flush=True)
    for name, B, N, H, window in TIMED:
        q1, q2, k1, k2, v = views(B, N, H, "cuda")
        times = {n: [] for n in ["triton", "library", *VARIANTS]}
        o = torch.empty(B, N, H, 64, device="cuda")
        launches = {}
        for vname, extra in VARIANTS.items():
            grid, args, kw = launch_args(q1, q2, k1, k2, v, window, o, extra=extra)
            launches[vname] = (lambda g=grid, a=args, k=kw, f=kerns[vname]: f[g](*a, **k))
        lib = lambda: ditfuse.sliding_window_attention(q1, k1, v, window, q2=q2, k2=k2, lam=0.8)
        launches["library"] = lib
        launches["triton"] = lib
        for r in range(rounds):
            for n, f in launches.items():
                attention.GLUON_SM90 = n != "triton"
                times[n].append(graph_us(f))
            attention.GLUON_SM90 = True
        print(f"{name:14s} " + " | ".join(f"{n} {min(ts):6.1f} ({max(ts):.1f})"
                                          for n, ts in times.items()), flush=True)


if __name__ == "__main__":
    build() if "--build" in sys.argv else main()
