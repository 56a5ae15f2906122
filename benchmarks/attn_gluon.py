"""Session 27 experiment: band attention written in Gluon (Triton 3.6's explicit-layout
dialect) so that the wgmma waits can be placed by hand -- FlashAttention-3's overlap of one
map's softmax with the other map's tensor-core work, which ``tl.dot`` cannot express
(it waits on every wgmma at once: benchmarks/NOTES.md, session 25).

Scope: the SAME-L entry of the shipped kernel -- differential, bf16/fp16, head_dim 64, no
prologue, (B, N, H, D) views with unit channel stride -- with the same tiles (64 queries,
``STEP_M`` stored, 32-key tiles from the tile's first key), the same band test, the same
softmax arithmetic (fp32, ex2.approx.ftz, running max from -FLT_MAX) and the same epilogue
(per-row reciprocals, one fma): the output should be bitwise the shipped kernel's.

A trip (key tile t, wgmma groups complete in issue order):

    issue S1 = Q1 K1^T, S2 = Q2 K2^T             (async)
    wait until 1 outstanding -> S1 and the previous trip's O1 / O2 are done
    issue the copies of tile t + STAGES - 1      (cp.async, into the stage trip t-1 used)
    softmax 1 (runs while S2 is on the tensor cores); O1 = O1 * alpha1; issue O1 += P1 V
    wait until 1 outstanding -> S2 done
    softmax 2 (runs while O1 is on the tensor cores); O2 = O2 * alpha2; issue O2 += P2 V

    PYTHONPATH=src python benchmarks/attn_gluon.py            # GPU: bits vs shipped + times
    PYTHONPATH=src python benchmarks/attn_gluon.py --build    # CPU: sm_90 build, registers
"""
from pathlib import Path
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, warpgroup_mma, warpgroup_mma_init, warpgroup_mma_wait)

# session 27's cp.async helpers (the library's kernel has used TMA since session 28)
sys.path.insert(0, str(Path(__file__).resolve().parent / "gluon_s28"))
from k_s27 import _copy_rows, _softmax_step as _softmax  # noqa: E402

LOG2E = 1.4426950408889634


@gluon.jit
def _swa_gluon_kernel(q_ptr, k_ptr, v_ptr, q2_ptr, k2_ptr, o_ptr, lam, qk_scale,
                      N, H: gl.constexpr, LEFT, RIGHT,
                      stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                      stride_vb, stride_vs, stride_vh, stride_q2b, stride_q2s, stride_q2h,
                      stride_k2b, stride_k2s, stride_k2h, stride_ob, stride_os, stride_oh,
                      D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                      STEP_M: gl.constexpr, STAGES: gl.constexpr,
                      AHEAD: gl.constexpr, DIRECT: gl.constexpr = False):
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_N, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, D, 16])
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    # 16-byte pieces: 8 threads a 128-byte row, 4 rows a warp
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    Q_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], dtype)
    KV_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], dtype)
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)

    bh = gl.program_id(0)
    start_m = gl.program_id(1) * STEP_M
    b = (bh // H).to(gl.int64)
    h = (bh % H).to(gl.int64)
    k_base = b * stride_kb + h * stride_kh
    k2_base = b * stride_k2b + h * stride_k2h
    v_base = b * stride_vb + h * stride_vh

    q_s = gl.allocate_shared_memory(dtype, [BLOCK_M, D], Q_SL)
    q2_s = gl.allocate_shared_memory(dtype, [BLOCK_M, D], Q_SL)
    k_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], KV_SL)
    k2_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], KV_SL)
    v_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], KV_SL)

    lo = gl.maximum(start_m - LEFT, 0)
    hi = gl.minimum(start_m + STEP_M + RIGHT, N)
    trips = gl.cdiv(hi - lo, BLOCK_N)

    _copy_rows(q_s, q_ptr, b * stride_qb + h * stride_qh, start_m, stride_qs, N, BLOCK_M, D, LD)
    _copy_rows(q2_s, q2_ptr, b * stride_q2b + h * stride_q2h, start_m, stride_q2s, N, BLOCK_M,
               D, LD)
    # group 0 holds Q and key tile 0, group i key tile i (an empty group past the last tile,
    # so that "tile t landed" is always "at most STAGES - 2 groups in flight")
    for t in gl.static_range(STAGES - 1):
        if t < trips:
            sn = lo + t * BLOCK_N
            _copy_rows(k_s.index(t), k_ptr, k_base, sn, stride_ks, N, BLOCK_N, D, LD)
            _copy_rows(k2_s.index(t), k2_ptr, k2_base, sn, stride_k2s, N, BLOCK_N, D, LD)
            _copy_rows(v_s.index(t), v_ptr, v_base, sn, stride_vs, N, BLOCK_N, D, LD)
        async_copy.commit_group()

    offs_m = start_m + gl.arange(0, BLOCK_M, layout=ROW_S)
    row_lo = offs_m - LEFT
    row_span = gl.minimum(offs_m + RIGHT, N - 1) - row_lo
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_L))
    m1 = gl.full([BLOCK_M], -3.4028234663852886e38, gl.float32, ROW_S)
    m2 = gl.full([BLOCK_M], -3.4028234663852886e38, gl.float32, ROW_S)
    l1 = gl.zeros([BLOCK_M], gl.float32, ROW_S)
    l2 = gl.zeros([BLOCK_M], gl.float32, ROW_S)
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, S_L)
    acc1 = warpgroup_mma_init(gl.zeros([BLOCK_M, D], gl.float32, O_L))
    acc2 = warpgroup_mma_init(gl.zeros([BLOCK_M, D], gl.float32, O_L))

    if AHEAD:
        # the first tile's S1 before the loop; each trip issues the next tile's S1 between
        # its two softmaxes, so two wgmma groups are in flight during each softmax
        async_copy.wait_group(STAGES - 2)
        gl.thread_barrier()
        fence_async_shared()
        s1 = warpgroup_mma(q_s, k_s.index(0).permute((1, 0)), zero_s, use_acc=False,
                           is_async=True)
        for t in range(trips):
            stage = t % STAGES
            start_n = lo + t * BLOCK_N
            s2 = warpgroup_mma(q2_s, k2_s.index(stage).permute((1, 0)), zero_s, use_acc=False,
                               is_async=True)
            # in flight: O1 t-1, S1 t, O2 t-1, S2 t -> O1 t-1 and S1 t done (trip 0: S1, S2)
            if t == 0:
                s1r, acc1r = warpgroup_mma_wait(1, deps=[s1, acc1])
            else:
                s1r, acc1r = warpgroup_mma_wait(2, deps=[s1, acc1])
            band = (cols[None, :] - (row_lo - start_n)[:, None]).to(gl.uint32, bitcast=True) \
                <= row_span[:, None].to(gl.uint32, bitcast=True)
            p1, a1, m1, l1 = _softmax(s1r, band, m1, l1, qk_scale)
            acc1r = acc1r * gl.convert_layout(a1, ROW_O)[:, None]
            acc1 = warpgroup_mma(gl.convert_layout(p1.to(dtype), P_L), v_s.index(stage), acc1r,
                                 is_async=True)
            if t + 1 < trips:
                # tile t + 1 landed: groups up to tile t + STAGES - 2 are committed
                async_copy.wait_group(STAGES - 3)
                gl.thread_barrier()
                fence_async_shared()
                s1 = warpgroup_mma(q_s, k_s.index((t + 1) % STAGES).permute((1, 0)), zero_s,
                                   use_acc=False, is_async=True)
                # in flight: O2 t-1, S2 t, O1 t, S1 t+1 -> O2 t-1 and S2 t done
                s2r, acc2r = warpgroup_mma_wait(2, deps=[s2, acc2])
            else:
                s2r, acc2r = warpgroup_mma_wait(1, deps=[s2, acc2])
            # the stage trip t-1 used is free: every product that read it is done
            nt = t + STAGES - 1
            if nt < trips:
                ns = nt % STAGES
                sn = lo + nt * BLOCK_N
                _copy_rows(k_s.index(ns), k_ptr, k_base, sn, stride_ks, N, BLOCK_N, D, LD)
                _copy_rows(k2_s.index(ns), k2_ptr, k2_base, sn, stride_k2s, N, BLOCK_N, D, LD)
                _copy_rows(v_s.index(ns), v_ptr, v_base, sn, stride_vs, N, BLOCK_N, D, LD)
            async_copy.commit_group()
            p2, a2, m2, l2 = _softmax(s2r, band, m2, l2, qk_scale)
            acc2r = acc2r * gl.convert_layout(a2, ROW_O)[:, None]
            acc2 = warpgroup_mma(gl.convert_layout(p2.to(dtype), P_L), v_s.index(stage), acc2r,
                                 is_async=True)
    else:
        for t in range(trips):
            stage = t % STAGES
            start_n = lo + t * BLOCK_N
            async_copy.wait_group(STAGES - 2)
            gl.thread_barrier()  # every thread's copies of tile t, before any wgmma reads them
            fence_async_shared()
            s1 = warpgroup_mma(q_s, k_s.index(stage).permute((1, 0)), zero_s, use_acc=False,
                               is_async=True)
            s2 = warpgroup_mma(q2_s, k2_s.index(stage).permute((1, 0)), zero_s, use_acc=False,
                               is_async=True)
            s1, acc1, acc2 = warpgroup_mma_wait(1, deps=[s1, acc1, acc2])
            # the stage trip t-1 used is free (its score and P @ V products are done)
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
            p1, a1, m1, l1 = _softmax(s1, band, m1, l1, qk_scale)
            acc1 = acc1 * gl.convert_layout(a1, ROW_O)[:, None]
            acc1 = warpgroup_mma(gl.convert_layout(p1.to(dtype), P_L), v_s.index(stage), acc1,
                                 is_async=True)
            s2 = warpgroup_mma_wait(1, deps=[s2])
            p2, a2, m2, l2 = _softmax(s2, band, m2, l2, qk_scale)
            acc2 = acc2 * gl.convert_layout(a2, ROW_O)[:, None]
            acc2 = warpgroup_mma(gl.convert_layout(p2.to(dtype), P_L), v_s.index(stage), acc2,
                                 is_async=True)

    acc1, acc2 = warpgroup_mma_wait(0, deps=[acc1, acc2])
    async_copy.wait_group(0)

    r1 = gl.convert_layout(1.0 / gl.where(l1 == 0.0, 1.0, l1), ROW_O)
    c2 = gl.convert_layout(lam * (1.0 / gl.where(l2 == 0.0, 1.0, l2)), ROW_O)
    out = gl.fma(acc2, -c2[:, None], acc1 * r1[:, None])
    if DIRECT:  # stored from the accumulator layout (4-byte pieces), no shared-memory trip
        out = out.to(dtype)
        rows = gl.arange(0, BLOCK_M, layout=ROW_O)
        d = gl.arange(0, D, layout=gl.SliceLayout(0, O_L))
    else:
        out = gl.convert_layout(out.to(dtype), LD)
        rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LD))
        d = gl.arange(0, D, layout=gl.SliceLayout(0, LD))
    om = start_m + rows
    o = o_ptr + (b * stride_ob + h * stride_oh + om.to(gl.int64) * stride_os)[:, None] + d[None, :]
    gl.store(o, out, mask=((om < N) & (rows < STEP_M))[:, None])


def call(q1, k1, v, q2, k2, window, lam=1.0, scale=None, step=62, stages=4, maxnreg=None,
         ahead=False, out=None, direct=False):
    """out = Attn(q1, k1, v) - lam * Attn(q2, k2, v) over |i - j| <= window (or (left, right))."""
    B, N, H, D = q1.shape
    left, right = (window, window) if isinstance(window, int) else window
    left = N if left < 0 else left
    right = N if right < 0 else right
    for name, t in (("q", q1), ("k", k1), ("v", v), ("q2", q2), ("k2", k2)):
        assert t.shape == q1.shape and t.dtype == q1.dtype and t.stride(3) == 1, name
    if out is None:
        out = torch.empty(B, N, H, D, dtype=q1.dtype, device=q1.device)
    scale = D ** -0.5 if scale is None else scale
    grid = (B * H, triton.cdiv(N, step))
    kw = {"maxnreg": maxnreg} if maxnreg else {}
    _swa_gluon_kernel[grid](
        q1, k1, v, q2, k2, out, float(lam), scale * LOG2E, N, H, left, right,
        *q1.stride()[:3], *k1.stride()[:3], *v.stride()[:3], *q2.stride()[:3], *k2.stride()[:3],
        *out.stride()[:3], D=D, BLOCK_M=64, BLOCK_N=32, STEP_M=step, STAGES=stages, AHEAD=ahead,
        DIRECT=direct, num_warps=4, enable_fp_fusion=False, **kw)
    return out


def build():
    """sm_90 build on the CPU: registers, spills, shared memory, SASS count, the waits."""
    import re

    import triton.backends.nvidia.compiler as nv
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from ditfuse import inspect_kernels as ik
    sig = {n: "*bf16" for n in ("q_ptr", "k_ptr", "v_ptr", "q2_ptr", "k2_ptr", "o_ptr")}
    sig.update({n: "fp32" for n in ("lam", "qk_scale")})
    ints = ["N", "LEFT", "RIGHT"] + [f"stride_{t}{a}" for t in ("q", "k", "v", "q2", "k2", "o")
                                      for a in "bsh"]
    sig.update({n: "i32" for n in ints})
    for stages, ahead, direct in ((4, False, False), (4, False, True), (4, True, False)):
        const = dict(H=24, D=64, BLOCK_M=64, BLOCK_N=32, STEP_M=62, STAGES=stages, AHEAD=ahead,
                     DIRECT=direct)
        sig.update({k: "constexpr" for k in const})
        # SAME's to_qkv chunks: every stride a multiple of 16 elements, 16-byte aligned bases
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(sig)
                 if n.endswith("_ptr") or n.startswith("stride_")}
        for cap in (None, 168):
            opts = dict(num_warps=4, enable_fp_fusion=False)
            if cap:
                opts["maxnreg"] = cap
            ck = triton.compile(GluonASTSource(_swa_gluon_kernel, sig, const, attrs),
                                target=GPUTarget("cuda", 90, 32), options=opts)
            ptx = ck.asm["ptx"]
            pt = ik.run_ptxas(ptx, nv.CUDAOptions(**opts), ck.metadata.name)
            waits = re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)
            sass = ik.run_cuobjdump(ck.asm["cubin"], ck.metadata.name)
            print(f"stages {stages} ahead {ahead} direct {direct} cap {cap}: regs {pt['regs']} spills {pt['spill_stores']} "
                  f"smem {ck.metadata.shared} sass {sass['sass_instructions']} "
                  f"wgmma waits {waits} cp.async {ptx.count('cp.async.cg')}+"
                  f"{ptx.count('cp.async.ca')}", flush=True)


def main():
    if "--build" in sys.argv:
        return build()
    import ditfuse
    from ditfuse.bench import graph_us
    variants = ((4, False, False), (4, False, True), (3, False, True))
    ok = True
    # bits: SAME's packed projection views, awkward N, windows, batch 2
    for B, N, win, dt in ((1, 8704, 17, torch.bfloat16), (2, 1000, 17, torch.bfloat16),
                          (1, 77, (3, 40), torch.float16), (2, 33, 100, torch.bfloat16),
                          (1, 300, 0, torch.bfloat16), (1, 513, (-1, 0), torch.float16),
                          (1, 200, (5, -1), torch.bfloat16), (1, 31, 1, torch.bfloat16)):
        g = torch.Generator(device="cuda").manual_seed(N)
        proj = torch.randn(B, N, 5 * 24 * 64, generator=g, device="cuda").to(dt)
        q1, q2, k1, k2, v = [t.unflatten(-1, (24, 64)) for t in proj.chunk(5, dim=-1)]
        want = ditfuse.sliding_window_attention(q1, k1, v, win, q2=q2, k2=k2, lam=0.8)
        for stages, ahead, direct in variants:
            got = torch.full_like(want, float("nan"))  # poisoned: an unwritten row differs
            call(q1, k1, v, q2, k2, win, lam=0.8, stages=stages, ahead=ahead, out=got,
                 direct=direct, step=ditfuse.attention.launch_settings(
                     64, dt, *(2 * (win,) if isinstance(win, int) else win), N, True,
                     False).step_m or 64)
            nd = (got.view(torch.int16) != want.view(torch.int16)).sum().item()
            d = (got.float() - want.float()).abs().max().item()
            ok &= nd == 0
            print(f"check B {B} N {N} window {win} {str(dt)[6:]} stages {stages} ahead {ahead} "
                  f"direct {direct}: "
                  f"{nd} elements differ from the shipped kernel's bits, max|d| {d:.3g}",
                  flush=True)
    print(f"bitwise the shipped kernel: {ok}", flush=True)
    for N, dt in ((8704, torch.bfloat16), (32946, torch.bfloat16), (4352, torch.bfloat16),
                  (8704, torch.float16)):
        g = torch.Generator(device="cuda").manual_seed(0)
        proj = torch.randn(1, N, 5 * 24 * 64, generator=g, device="cuda").to(dt)
        q1, q2, k1, k2, v = [t.unflatten(-1, (24, 64)) for t in proj.chunk(5, dim=-1)]
        for rnd in range(3):
            t_ship = graph_us(lambda: ditfuse.sliding_window_attention(q1, k1, v, 17, q2=q2,
                                                                       k2=k2))
            res = []
            for stages, ahead, direct in variants:
                t = graph_us(lambda: call(q1, k1, v, q2, k2, 17, stages=stages, ahead=ahead,
                                          direct=direct))
                res.append(f"st{stages}{'/ahead' if ahead else ''}{'/direct' if direct else ''}"
                           f": {t:6.1f}")
            print(f"N {N:5d} {str(dt)[6:]} round {rnd}: shipped {t_ship:6.1f} us | gluon "
                  + " ".join(res), flush=True)


if __name__ == "__main__":
    main()
