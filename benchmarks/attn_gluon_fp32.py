"""Session 27 experiment: the fp32 (tf32) SAME-L differential entry in Gluon, with the two
query tiles held in registers as mma.sync A operands for the whole program.

The shipped Triton entry (32 queries on 2 warps, 30 stored, 16-key tiles, P @ V as two
32-column halves, 3 stages, capped at 168 registers) keeps Q1 / Q2 in shared memory and
reloads both into the operand layout every key trip (``ttg.local_load`` in its loop: 16 KB
of shared-memory reads a trip on top of the 12 KB of K1 / K2 / V), and its 40 KB of shared
memory allow 5 programs an SM. Here Q1 / Q2 are loaded once into registers (64 a thread),
the shared memory holds only the K1 / K2 / V ring (12 KB a stage), and the rest is the same
arithmetic: S = Q K^T by m16n8k8 tf32 mma.sync from a zero accumulator, the same softmax,
``acc * alpha`` then P @ V into it per 32-column half, the same epilogue. The output should
be bitwise the shipped kernel's.

    PYTHONPATH=src python benchmarks/attn_gluon_fp32.py            # GPU: bits + times
    PYTHONPATH=src python benchmarks/attn_gluon_fp32.py --build    # CPU: sm_90 builds
"""
from pathlib import Path
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy, mma_v2

# session 27's cp.async helpers (the library's kernel has used TMA since session 28)
sys.path.insert(0, str(Path(__file__).resolve().parent / "gluon_s28"))
from k_s27 import _copy_rows, _softmax_step as _softmax  # noqa: E402

LOG2E = 1.4426950408889634


@gluon.jit
def _load_rows(ptr, base, start, stride_s, N, BLOCK: gl.constexpr, D: gl.constexpr,
               LD: gl.constexpr):
    r = start + gl.arange(0, BLOCK, layout=gl.SliceLayout(1, LD))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, LD))
    p = ptr + (base + r.to(gl.int64) * stride_s)[:, None] + d[None, :]
    return gl.load(p, mask=(r < N)[:, None], other=0.0)


@gluon.jit
def _swa_fp32_kernel(q_ptr, k_ptr, v_ptr, q2_ptr, k2_ptr, o_ptr, lam, qk_scale,
                     N, H: gl.constexpr, LEFT, RIGHT,
                     stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                     stride_vb, stride_vs, stride_vh, stride_q2b, stride_q2s, stride_q2h,
                     stride_k2b, stride_k2s, stride_k2h, stride_ob, stride_os, stride_oh,
                     D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                     STEP_M: gl.constexpr, STAGES: gl.constexpr, NW: gl.constexpr):
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[NW, 1],
                                                  instr_shape=[16, 8])
    A_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=1)
    B_L: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=1)
    # 16-byte pieces: 16 threads a 256-byte row
    LD: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [NW, 1], [1, 0])
    SL: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0])
    ROW: gl.constexpr = gl.SliceLayout(1, MMA)
    DH: gl.constexpr = D // 2

    bh = gl.program_id(0)
    start_m = gl.program_id(1) * STEP_M
    b = (bh // H).to(gl.int64)
    h = (bh % H).to(gl.int64)
    k_base = b * stride_kb + h * stride_kh
    k2_base = b * stride_k2b + h * stride_k2h
    v_base = b * stride_vb + h * stride_vh

    k_s = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_N, D], SL)
    k2_s = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_N, D], SL)
    v_s = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_N, D], SL)

    lo = gl.maximum(start_m - LEFT, 0)
    hi = gl.minimum(start_m + STEP_M + RIGHT, N)
    trips = gl.cdiv(hi - lo, BLOCK_N)
    for t in gl.static_range(STAGES - 1):
        if t < trips:
            sn = lo + t * BLOCK_N
            _copy_rows(k_s.index(t), k_ptr, k_base, sn, stride_ks, N, BLOCK_N, D, LD)
            _copy_rows(k2_s.index(t), k2_ptr, k2_base, sn, stride_k2s, N, BLOCK_N, D, LD)
            _copy_rows(v_s.index(t), v_ptr, v_base, sn, stride_vs, N, BLOCK_N, D, LD)
        async_copy.commit_group()
    # both query tiles in registers, in the A operand layout, for the whole program
    q1 = gl.convert_layout(_load_rows(q_ptr, b * stride_qb + h * stride_qh, start_m, stride_qs,
                                      N, BLOCK_M, D, LD), A_L)
    q2 = gl.convert_layout(_load_rows(q2_ptr, b * stride_q2b + h * stride_q2h, start_m,
                                      stride_q2s, N, BLOCK_M, D, LD), A_L)

    offs_m = start_m + gl.arange(0, BLOCK_M, layout=ROW)
    row_lo = offs_m - LEFT
    row_span = gl.minimum(offs_m + RIGHT, N - 1) - row_lo
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, MMA))
    m1 = gl.full([BLOCK_M], -3.4028234663852886e38, gl.float32, ROW)
    m2 = gl.full([BLOCK_M], -3.4028234663852886e38, gl.float32, ROW)
    l1 = gl.zeros([BLOCK_M], gl.float32, ROW)
    l2 = gl.zeros([BLOCK_M], gl.float32, ROW)
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, MMA)
    acc1 = gl.zeros([BLOCK_M, DH], gl.float32, MMA)
    acc1b = gl.zeros([BLOCK_M, DH], gl.float32, MMA)
    acc2 = gl.zeros([BLOCK_M, DH], gl.float32, MMA)
    acc2b = gl.zeros([BLOCK_M, DH], gl.float32, MMA)

    for t in range(trips):
        stage = t % STAGES
        start_n = lo + t * BLOCK_N
        async_copy.wait_group(STAGES - 2)
        gl.thread_barrier()  # tile t visible to every warp; every warp done with trip t-1
        nt = t + STAGES - 1
        if nt < trips:
            ns = nt % STAGES
            sn = lo + nt * BLOCK_N
            _copy_rows(k_s.index(ns), k_ptr, k_base, sn, stride_ks, N, BLOCK_N, D, LD)
            _copy_rows(k2_s.index(ns), k2_ptr, k2_base, sn, stride_k2s, N, BLOCK_N, D, LD)
            _copy_rows(v_s.index(ns), v_ptr, v_base, sn, stride_vs, N, BLOCK_N, D, LD)
        async_copy.commit_group()
        band = (cols[None, :] - (row_lo - start_n)[:, None]).to(gl.uint32, bitcast=True) <= \
            row_span[:, None].to(gl.uint32, bitcast=True)
        s1 = mma_v2(q1, k_s.index(stage).permute((1, 0)).load(B_L), zero_s,
                    input_precision="tf32")
        p1, a1, m1, l1 = _softmax(s1, band, m1, l1, qk_scale)
        s2 = mma_v2(q2, k2_s.index(stage).permute((1, 0)).load(B_L), zero_s,
                    input_precision="tf32")
        p2, a2, m2, l2 = _softmax(s2, band, m2, l2, qk_scale)
        vt = v_s.index(stage)
        va = vt.slice(0, DH, dim=1).load(B_L)
        vb = vt.slice(DH, DH, dim=1).load(B_L)
        pa1 = gl.convert_layout(p1, A_L)
        acc1 = mma_v2(pa1, va, acc1 * a1[:, None], input_precision="tf32")
        acc1b = mma_v2(pa1, vb, acc1b * a1[:, None], input_precision="tf32")
        pa2 = gl.convert_layout(p2, A_L)
        acc2 = mma_v2(pa2, va, acc2 * a2[:, None], input_precision="tf32")
        acc2b = mma_v2(pa2, vb, acc2b * a2[:, None], input_precision="tf32")
    async_copy.wait_group(0)

    r1 = 1.0 / gl.where(l1 == 0.0, 1.0, l1)
    c2 = lam * (1.0 / gl.where(l2 == 0.0, 1.0, l2))
    OL: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [NW, 1], [1, 0])
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, OL))
    d = gl.arange(0, DH, layout=gl.SliceLayout(0, OL))
    om = start_m + rows
    o = o_ptr + (b * stride_ob + h * stride_oh + om.to(gl.int64) * stride_os)[:, None] + \
        d[None, :]
    smask = ((om < N) & (rows < STEP_M))[:, None]
    outa = gl.convert_layout(gl.fma(acc2, -c2[:, None], acc1 * r1[:, None]), OL)
    gl.store(o, outa, mask=smask)
    outb = gl.convert_layout(gl.fma(acc2b, -c2[:, None], acc1b * r1[:, None]), OL)
    gl.store(o + DH, outb, mask=smask)


def call(q1, k1, v, q2, k2, window, lam=1.0, scale=None, step=30, stages=2, maxnreg=168,
         block_m=32, nw=2, out=None):
    B, N, H, D = q1.shape
    left, right = (window, window) if isinstance(window, int) else window
    for name, t in (("q", q1), ("k", k1), ("v", v), ("q2", q2), ("k2", k2)):
        assert t.shape == q1.shape and t.dtype == torch.float32 and t.stride(3) == 1, name
    if out is None:
        out = torch.empty(B, N, H, D, dtype=q1.dtype, device=q1.device)
    scale = D ** -0.5 if scale is None else scale
    grid = (B * H, triton.cdiv(N, step))
    kw = {"maxnreg": maxnreg} if maxnreg else {}
    _swa_fp32_kernel[grid](
        q1, k1, v, q2, k2, out, float(lam), scale * LOG2E, N, H, left, right,
        *q1.stride()[:3], *k1.stride()[:3], *v.stride()[:3], *q2.stride()[:3], *k2.stride()[:3],
        *out.stride()[:3], D=D, BLOCK_M=block_m, BLOCK_N=16, STEP_M=step, STAGES=stages,
        NW=nw, num_warps=nw, enable_fp_fusion=False, **kw)
    return out


VARIANTS = [(2, 168), (3, 168), (2, None), (2, 128)]


def build():
    import re

    import triton.backends.nvidia.compiler as nv
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from ditfuse import inspect_kernels as ik
    sig = {n: "*fp32" for n in ("q_ptr", "k_ptr", "v_ptr", "q2_ptr", "k2_ptr", "o_ptr")}
    sig.update({n: "fp32" for n in ("lam", "qk_scale")})
    ints = ["N", "LEFT", "RIGHT"] + [f"stride_{t}{a}" for t in ("q", "k", "v", "q2", "k2", "o")
                                      for a in "bsh"]
    sig.update({n: "i32" for n in ints})
    for stages, cap in VARIANTS:
        const = dict(H=24, D=64, BLOCK_M=32, BLOCK_N=16, STEP_M=30, STAGES=stages, NW=2)
        sig.update({k: "constexpr" for k in const})
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(sig)
                 if n.endswith("_ptr") or n.startswith("stride_")}
        opts = dict(num_warps=2, enable_fp_fusion=False)
        if cap:
            opts["maxnreg"] = cap
        ck = triton.compile(GluonASTSource(_swa_fp32_kernel, sig, const, attrs),
                            target=GPUTarget("cuda", 90, 32), options=opts)
        ptx = ck.asm["ptx"]
        pt = ik.run_ptxas(ptx, nv.CUDAOptions(**opts), ck.metadata.name)
        sass = ik.run_cuobjdump(ck.asm["cubin"], ck.metadata.name)
        print(f"stages {stages} cap {cap}: regs {pt['regs']} spills {pt['spill_stores']} smem "
              f"{ck.metadata.shared} sass {sass['sass_instructions']} mma "
              f"{len(re.findall(r'mma.sync', ptx))} local in loops "
              f"{sass.get('local_in_loops', '?')}", flush=True)


def _contract(N, B=1):
    """The TensorRT contract's layout: Q / K (B, N, 2H, D) with the two maps' heads side by
    side, V (B, N, H, D)."""
    g = torch.Generator(device="cuda").manual_seed(N)
    q = torch.randn(B, N, 48, 64, generator=g, device="cuda")
    k = torch.randn(B, N, 48, 64, generator=g, device="cuda")
    v = torch.randn(B, N, 24, 64, generator=g, device="cuda")
    return q[:, :, :24], k[:, :, :24], v, q[:, :, 24:], k[:, :, 24:]


def main():
    if "--build" in sys.argv:
        return build()
    import ditfuse
    from ditfuse.bench import graph_us
    ok = True
    for B, N, win in ((1, 4352, 17), (2, 1000, 17), (1, 33, 17), (1, 300, 0), (1, 8704, 17),
                      (1, 31, 1)):
        q1, k1, v, q2, k2 = _contract(N, B)
        want = ditfuse.sliding_window_attention(q1, k1, v, win, q2=q2, k2=k2, lam=0.8)
        step = ditfuse.attention.launch_settings(64, torch.float32, win, win, N, True,
                                                 False).step_m
        for stages, cap in VARIANTS:
            got = torch.full_like(want, float("nan"))
            call(q1, k1, v, q2, k2, win, lam=0.8, step=step, stages=stages, maxnreg=cap, out=got)
            nd = (got.view(torch.int32) != want.view(torch.int32)).sum().item()
            ok &= nd == 0
            print(f"check B {B} N {N} window {win} stages {stages} cap {cap}: {nd} elements "
                  f"differ from the shipped kernel's bits, max|d| "
                  f"{(got - want).abs().max().item():.3g}", flush=True)
    print(f"bitwise the shipped kernel: {ok}", flush=True)
    for N in (4352, 8704):
        q1, k1, v, q2, k2 = _contract(N)
        for rnd in range(3):
            t_ship = graph_us(lambda: ditfuse.sliding_window_attention(q1, k1, v, 17, q2=q2,
                                                                       k2=k2))
            res = [f"st{s}/{c}: {graph_us(lambda: call(q1, k1, v, q2, k2, 17, stages=s, maxnreg=c)):6.1f}"
                   for s, c in VARIANTS]
            print(f"N {N:5d} fp32 round {rnd}: shipped {t_ship:6.1f} us | gluon " + " ".join(res),
                  flush=True)


if __name__ == "__main__":
    main()
