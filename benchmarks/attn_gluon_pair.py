"""Session 27 experiment: the Gluon SAME-L entry (``ditfuse._attn_gluon``) with two
(batch, head) tiles a program, run back to back over one continuous cp.async ring: the
second head's Q tiles are copied with the first's (their own shared-memory buffers) and its
first key tiles while the first head's last trips compute, so only the first head of a
program waits for its start. Same tiles and arithmetic per head as the shipped kernel: the
output should be bitwise the library's.

    PYTHONPATH=src python benchmarks/attn_gluon_pair.py            # GPU: bits + times
    PYTHONPATH=src python benchmarks/attn_gluon_pair.py --build    # CPU: sm_90 build
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
from k_s27 import _copy_rows, _softmax_step  # noqa: E402

LOG2E = 1.4426950408889634


@gluon.jit
def _copy_flat(k_s, k2_s, v_s, i, trips, lo, bh0, k_ptr, k2_ptr, v_ptr, stride_kb, stride_kh,
               stride_k2b, stride_k2h, stride_vb, stride_vh, stride_ks, stride_k2s, stride_vs,
               N, H: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr,
               STAGES: gl.constexpr, LD: gl.constexpr):
    """Key tile ``i`` of the program's flattened sequence (head ``i // trips``)."""
    item = i // trips
    t = i - item * trips
    bh = bh0 + item
    b = (bh // H).to(gl.int64)
    h = (bh % H).to(gl.int64)
    sn = lo + t * BLOCK_N
    s = i % STAGES
    _copy_rows(k_s.index(s), k_ptr, b * stride_kb + h * stride_kh, sn, stride_ks, N, BLOCK_N,
               D, LD)
    _copy_rows(k2_s.index(s), k2_ptr, b * stride_k2b + h * stride_k2h, sn, stride_k2s, N,
               BLOCK_N, D, LD)
    _copy_rows(v_s.index(s), v_ptr, b * stride_vb + h * stride_vh, sn, stride_vs, N, BLOCK_N,
               D, LD)


@gluon.jit
def _pair_kernel(q_ptr, k_ptr, v_ptr, q2_ptr, k2_ptr, o_ptr, lam, qk_scale, N, LEFT, RIGHT,
                 stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                 stride_vb, stride_vs, stride_vh, stride_q2b, stride_q2s, stride_q2h,
                 stride_k2b, stride_k2s, stride_k2h, stride_ob, stride_os, stride_oh,
                 H: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, STEP_M: gl.constexpr, STAGES: gl.constexpr):
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_N, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, D, 16])
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    TPR: gl.constexpr = D // 8
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TPR, TPR], [4, 1], [1, 0])
    Q_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], dtype)
    KV_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], dtype)
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)

    bh0 = gl.program_id(0) * 2
    start_m = gl.program_id(1) * STEP_M
    q_s = gl.allocate_shared_memory(dtype, [2, BLOCK_M, D], Q_SL)
    q2_s = gl.allocate_shared_memory(dtype, [2, BLOCK_M, D], Q_SL)
    k_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], KV_SL)
    k2_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], KV_SL)
    v_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], KV_SL)

    lo = gl.maximum(start_m - LEFT, 0)
    hi = gl.minimum(start_m + STEP_M + RIGHT, N)
    trips = gl.cdiv(hi - lo, BLOCK_N)
    total = 2 * trips
    for item in gl.static_range(2):
        b = ((bh0 + item) // H).to(gl.int64)
        h = ((bh0 + item) % H).to(gl.int64)
        _copy_rows(q_s.index(item), q_ptr, b * stride_qb + h * stride_qh, start_m, stride_qs, N,
                   BLOCK_M, D, LD)
        _copy_rows(q2_s.index(item), q2_ptr, b * stride_q2b + h * stride_q2h, start_m,
                   stride_q2s, N, BLOCK_M, D, LD)
    for j in gl.static_range(STAGES - 1):
        if j < total:
            _copy_flat(k_s, k2_s, v_s, j, trips, lo, bh0, k_ptr, k2_ptr, v_ptr, stride_kb,
                       stride_kh, stride_k2b, stride_k2h, stride_vb, stride_vh, stride_ks,
                       stride_k2s, stride_vs, N, H, BLOCK_N, D, STAGES, LD)
        async_copy.commit_group()

    offs_m = start_m + gl.arange(0, BLOCK_M, layout=ROW_S)
    row_lo = offs_m - LEFT
    row_span = gl.minimum(offs_m + RIGHT, N - 1) - row_lo
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_L))
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, S_L)
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LD))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, LD))
    om = start_m + rows
    for item in gl.static_range(2):
        m1 = gl.full([BLOCK_M], -3.4028234663852886e38, gl.float32, ROW_S)
        m2 = gl.full([BLOCK_M], -3.4028234663852886e38, gl.float32, ROW_S)
        l1 = gl.zeros([BLOCK_M], gl.float32, ROW_S)
        l2 = gl.zeros([BLOCK_M], gl.float32, ROW_S)
        acc1 = warpgroup_mma_init(gl.zeros([BLOCK_M, D], gl.float32, O_L))
        acc2 = warpgroup_mma_init(gl.zeros([BLOCK_M, D], gl.float32, O_L))
        qa = q_s.index(item)
        qb = q2_s.index(item)
        for t in range(trips):
            fi = item * trips + t
            stage = fi % STAGES
            start_n = lo + t * BLOCK_N
            async_copy.wait_group(STAGES - 2)
            gl.thread_barrier()
            fence_async_shared()
            s1 = warpgroup_mma(qa, k_s.index(stage).permute((1, 0)), zero_s, use_acc=False,
                               is_async=True)
            s2 = warpgroup_mma(qb, k2_s.index(stage).permute((1, 0)), zero_s, use_acc=False,
                               is_async=True)
            s1, acc1, acc2 = warpgroup_mma_wait(1, deps=[s1, acc1, acc2])
            ni = fi + STAGES - 1
            if ni < total:
                _copy_flat(k_s, k2_s, v_s, ni, trips, lo, bh0, k_ptr, k2_ptr, v_ptr, stride_kb,
                           stride_kh, stride_k2b, stride_k2h, stride_vb, stride_vh, stride_ks,
                           stride_k2s, stride_vs, N, H, BLOCK_N, D, STAGES, LD)
            async_copy.commit_group()
            band = (cols[None, :] - (row_lo - start_n)[:, None]).to(gl.uint32, bitcast=True) \
                <= row_span[:, None].to(gl.uint32, bitcast=True)
            p1, a1, m1, l1 = _softmax_step(s1, band, m1, l1, qk_scale)
            acc1 = acc1 * gl.convert_layout(a1, ROW_O)[:, None]
            acc1 = warpgroup_mma(gl.convert_layout(p1.to(dtype), P_L), v_s.index(stage), acc1,
                                 is_async=True)
            s2 = warpgroup_mma_wait(1, deps=[s2])
            p2, a2, m2, l2 = _softmax_step(s2, band, m2, l2, qk_scale)
            acc2 = acc2 * gl.convert_layout(a2, ROW_O)[:, None]
            acc2 = warpgroup_mma(gl.convert_layout(p2.to(dtype), P_L), v_s.index(stage), acc2,
                                 is_async=True)
        acc1, acc2 = warpgroup_mma_wait(0, deps=[acc1, acc2])
        r1 = gl.convert_layout(1.0 / gl.where(l1 == 0.0, 1.0, l1), ROW_O)
        c2 = gl.convert_layout(lam * (1.0 / gl.where(l2 == 0.0, 1.0, l2)), ROW_O)
        out = gl.fma(acc2, -c2[:, None], acc1 * r1[:, None])
        # through this head's Q buffer (dead now): no scratch beside the live ring
        ob = q_s.index(item)
        ob.store(out.to(dtype))
        gl.thread_barrier()
        out = ob.load(LD)
        b = ((bh0 + item) // H).to(gl.int64)
        h = ((bh0 + item) % H).to(gl.int64)
        o = o_ptr + (b * stride_ob + h * stride_oh + om.to(gl.int64) * stride_os)[:, None] + \
            d[None, :]
        gl.store(o, out, mask=((om < N) & (rows < STEP_M))[:, None])
    async_copy.wait_group(0)


def call(q1, k1, v, q2, k2, window, lam=1.0, step=62, stages=3, out=None):
    B, N, H, D = q1.shape
    assert (B * H) % 2 == 0
    if out is None:
        out = torch.empty(B, N, H, D, dtype=q1.dtype, device=q1.device)
    grid = (B * H // 2, triton.cdiv(N, step))
    _pair_kernel[grid](q1, k1, v, q2, k2, out, float(lam), D ** -0.5 * LOG2E, N, window, window,
                       *q1.stride()[:3], *k1.stride()[:3], *v.stride()[:3], *q2.stride()[:3],
                       *k2.stride()[:3], *out.stride()[:3], H=H, D=D, BLOCK_M=64, BLOCK_N=32,
                       STEP_M=step, STAGES=stages, num_warps=4, enable_fp_fusion=False)
    return out


def build():
    import triton.backends.nvidia.compiler as nv
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from ditfuse import inspect_kernels as ik
    sig = {n: "*bf16" for n in ("q_ptr", "k_ptr", "v_ptr", "q2_ptr", "k2_ptr", "o_ptr")}
    sig.update({n: "fp32" for n in ("lam", "qk_scale")})
    ints = ["N", "LEFT", "RIGHT"] + [f"stride_{t}{a}" for t in ("q", "k", "v", "q2", "k2", "o")
                                      for a in "bsh"]
    sig.update({n: "i32" for n in ints})
    for stages in (2, 3, 4):
        const = dict(H=24, D=64, BLOCK_M=64, BLOCK_N=32, STEP_M=62, STAGES=stages)
        sig.update({k: "constexpr" for k in const})
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(sig)
                 if n.endswith("_ptr") or n.startswith("stride_")}
        opts = dict(num_warps=4, enable_fp_fusion=False)
        ck = triton.compile(GluonASTSource(_pair_kernel, sig, const, attrs),
                            target=GPUTarget("cuda", 90, 32), options=opts)
        pt = ik.run_ptxas(ck.asm["ptx"], nv.CUDAOptions(**opts), ck.metadata.name)
        sass = ik.run_cuobjdump(ck.asm["cubin"], ck.metadata.name)
        print(f"stages {stages}: regs {pt['regs']} spills {pt['spill_stores']} smem "
              f"{ck.metadata.shared} sass {sass['sass_instructions']}", flush=True)


def main():
    if "--build" in sys.argv:
        return build()
    import ditfuse
    from ditfuse.bench import graph_us
    ok = True
    for B, N, dt in ((1, 8704, torch.bfloat16), (2, 1000, torch.bfloat16), (1, 33, torch.float16)):
        g = torch.Generator(device="cuda").manual_seed(N)
        proj = torch.randn(B, N, 5 * 24 * 64, generator=g, device="cuda").to(dt)
        q1, q2, k1, k2, v = [t.unflatten(-1, (24, 64)) for t in proj.chunk(5, dim=-1)]
        want = ditfuse.sliding_window_attention(q1, k1, v, 17, q2=q2, k2=k2, lam=0.8)
        for stages in (3, 2):
            got = torch.full_like(want, float("nan"))
            call(q1, k1, v, q2, k2, 17, lam=0.8, stages=stages, out=got)
            nd = (got.view(torch.int16) != want.view(torch.int16)).sum().item()
            ok &= nd == 0
            print(f"check B {B} N {N} {str(dt)[6:]} stages {stages}: {nd} elements differ",
                  flush=True)
    print(f"bitwise the library: {ok}", flush=True)
    for N in (8704, 32946, 4352):
        g = torch.Generator(device="cuda").manual_seed(0)
        proj = torch.randn(1, N, 5 * 24 * 64, generator=g, device="cuda").to(torch.bfloat16)
        q1, q2, k1, k2, v = [t.unflatten(-1, (24, 64)) for t in proj.chunk(5, dim=-1)]
        for rnd in range(3):
            t_lib = graph_us(lambda: ditfuse.sliding_window_attention(q1, k1, v, 17, q2=q2,
                                                                      k2=k2))
            res = " ".join(f"st{s}: {graph_us(lambda: call(q1, k1, v, q2, k2, 17, stages=s)):6.1f}"
                           for s in (3, 2))
            print(f"N {N:5d} bf16 round {rnd}: library (Gluon) {t_lib:6.1f} us | pair {res}",
                  flush=True)


if __name__ == "__main__":
    main()
