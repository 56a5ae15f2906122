"""Session 29 prototype: the fp32 Gluon entry in 72 KB of shared memory (3 programs an SM):
Q1 / Q2 (32 KB), one K1 / K2 buffer (16 KB) refilled with the next tile once every warp's
score products are done, two raw V buffers (V of tile t + 2 copied as soon as tile t's is
in registers) and one transposed-V buffer (8 KB). A trip over key tile t:

    wait K1, K2 (t); issue S1, S2                              (async)
    wait V (t); V -> registers
    wait for S1 and S2; block barrier (K free, raw V (t) free, vt free)
    TMA K1, K2 (t + 1), V (t + 2); registers -> vt; fence; block barrier
    softmax 1; O1 *= alpha1; issue O1 += P1 V; softmax 2; O2 *= alpha2; issue O2 += P2 V
    wait for both P @ V
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from ditfuse._attn_gluon import _softmax_step


@gluon.jit
def _swa_diff_fp32_sm90_kernel(
    q_desc, k_desc, v_desc, q2_desc, k2_desc, o_ptr, lam_ptr, lam, qk_scale,
    N, LEFT, RIGHT, stride_ob, stride_os, stride_oh, stride_lam,
    H: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    STEP_M: gl.constexpr, TRIPS: gl.constexpr, LAM_PTR: gl.constexpr,
    TOKEN_MAJOR: gl.constexpr, VT_BUFS: gl.constexpr,
):
    DL: gl.constexpr = q_desc.layout
    NB_Q: gl.constexpr = BLOCK_M * D * 4
    NB_K: gl.constexpr = BLOCK_N * D * 4
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_N, 8])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, D, 8])
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=1)
    VL: gl.constexpr = gl.BlockedLayout([4, 1], [1, 32], [1, 4], [0, 1])
    TPR: gl.constexpr = D // 4
    LD: gl.constexpr = gl.BlockedLayout([1, 4], [32 // TPR, TPR], [4, 1], [1, 0])
    Q_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], gl.float32)
    KV_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], gl.float32)
    VT_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([D, BLOCK_N], gl.float32)
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)

    if TOKEN_MAJOR:
        bh = gl.program_id(0)
        start_m = gl.program_id(1) * STEP_M
    else:
        start_m = gl.program_id(0) * STEP_M
        bh = gl.program_id(1)
    b = bh // H
    h = bh % H

    q_s = gl.allocate_shared_memory(gl.float32, [1, BLOCK_M, 1, D], DL)
    q2_s = gl.allocate_shared_memory(gl.float32, [1, BLOCK_M, 1, D], DL)
    k_s = gl.allocate_shared_memory(gl.float32, [1, BLOCK_N, 1, D], DL)
    k2_s = gl.allocate_shared_memory(gl.float32, [1, BLOCK_N, 1, D], DL)
    v_s = gl.allocate_shared_memory(gl.float32, [2, 1, BLOCK_N, 1, D], DL)
    vt_s = gl.allocate_shared_memory(gl.float32, [D, BLOCK_N], VT_SL)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q2_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k2_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    v_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(q2_bar, count=1)
    mbarrier.init(k_bar, count=1)
    mbarrier.init(k2_bar, count=1)
    mbarrier.init(v_bar.index(0), count=1)
    mbarrier.init(v_bar.index(1), count=1)
    fence_async_shared()

    lo = gl.maximum(start_m - LEFT, 0)
    hi = gl.minimum(start_m + STEP_M + RIGHT, N)
    trips = gl.cdiv(hi - lo, BLOCK_N)
    mbarrier.expect(q_bar, NB_Q)
    mbarrier.expect(q2_bar, NB_Q)
    mbarrier.expect(k_bar, NB_K)
    mbarrier.expect(k2_bar, NB_K)
    mbarrier.expect(v_bar.index(0), NB_K)
    tma.async_copy_global_to_shared(q_desc, [b, start_m, h, 0], q_bar, q_s)
    tma.async_copy_global_to_shared(k_desc, [b, lo, h, 0], k_bar, k_s)
    tma.async_copy_global_to_shared(q2_desc, [b, start_m, h, 0], q2_bar, q2_s)
    tma.async_copy_global_to_shared(k2_desc, [b, lo, h, 0], k2_bar, k2_s)
    tma.async_copy_global_to_shared(v_desc, [b, lo, h, 0], v_bar.index(0), v_s.index(0))
    if trips > 1:
        mbarrier.expect(v_bar.index(1), NB_K)
        tma.async_copy_global_to_shared(v_desc, [b, lo + BLOCK_N, h, 0], v_bar.index(1),
                                        v_s.index(1))

    offs_m = start_m + gl.arange(0, BLOCK_M, layout=ROW_S)
    row_lo = offs_m - LEFT
    row_span = gl.minimum(offs_m + RIGHT, N - 1) - row_lo
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_L))
    m1 = gl.full([BLOCK_M], -3.4028234663852886e38, gl.float32, ROW_S)
    m2 = gl.full([BLOCK_M], -3.4028234663852886e38, gl.float32, ROW_S)
    l1 = gl.zeros([BLOCK_M], gl.float32, ROW_S)
    l2 = gl.zeros([BLOCK_M], gl.float32, ROW_S)
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, S_L)
    acc1 = gl.zeros([BLOCK_M, D], gl.float32, O_L)
    acc2 = gl.zeros([BLOCK_M, D], gl.float32, O_L)

    q_s = q_s._reinterpret(gl.float32, [BLOCK_M, D], Q_SL)
    q2_s = q2_s._reinterpret(gl.float32, [BLOCK_M, D], Q_SL)
    ks = k_s._reinterpret(gl.float32, [BLOCK_N, D], KV_SL)
    k2s = k2_s._reinterpret(gl.float32, [BLOCK_N, D], KV_SL)
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(q2_bar, 0)
    for t in range(trips):
        start_n = lo + t * BLOCK_N
        mbarrier.wait(k_bar, t & 1)
        mbarrier.wait(k2_bar, t & 1)
        s1 = warpgroup_mma(q_s, ks.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        s2 = warpgroup_mma(q2_s, k2s.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        vb = t % 2
        mbarrier.wait(v_bar.index(vb), (t // 2) & 1)
        v = v_s.index(vb)._reinterpret(gl.float32, [BLOCK_N, D], KV_SL).load(VL)
        s1, s2 = warpgroup_mma_wait(0, deps=[s1, s2])
        gl.thread_barrier()  # K, raw V (t) and vt free in every warp
        if t + 1 < trips:
            mbarrier.expect(k_bar, NB_K)
            mbarrier.expect(k2_bar, NB_K)
            tma.async_copy_global_to_shared(k_desc, [b, start_n + BLOCK_N, h, 0], k_bar, k_s)
            tma.async_copy_global_to_shared(k2_desc, [b, start_n + BLOCK_N, h, 0], k2_bar,
                                            k2_s)
        if t + 2 < trips:
            mbarrier.expect(v_bar.index(vb), NB_K)
            tma.async_copy_global_to_shared(v_desc, [b, start_n + 2 * BLOCK_N, h, 0],
                                            v_bar.index(vb), v_s.index(vb))
        vt_s.store(gl.permute(v, (1, 0)))
        fence_async_shared()
        gl.thread_barrier()
        band = (cols[None, :] - (row_lo - start_n)[:, None]).to(gl.uint32, bitcast=True) <= \
            row_span[:, None].to(gl.uint32, bitcast=True)
        p1, a1, m1, l1 = _softmax_step(s1, band, m1, l1, qk_scale)
        acc1 = acc1 * gl.convert_layout(a1, ROW_O)[:, None]
        acc1 = warpgroup_mma(gl.convert_layout(p1, P_L), vt_s.permute((1, 0)), acc1,
                             is_async=True)
        p2, a2, m2, l2 = _softmax_step(s2, band, m2, l2, qk_scale)
        acc2 = acc2 * gl.convert_layout(a2, ROW_O)[:, None]
        acc2 = warpgroup_mma(gl.convert_layout(p2, P_L), vt_s.permute((1, 0)), acc2,
                             is_async=True)
        acc1, acc2 = warpgroup_mma_wait(0, deps=[acc1, acc2])

    b = b.to(gl.int64)
    h = h.to(gl.int64)
    if LAM_PTR:
        lam_h = gl.load(lam_ptr + h * stride_lam).to(gl.float32)
    else:
        lam_h = lam
    r1 = gl.convert_layout(1.0 / gl.where(l1 == 0.0, 1.0, l1), ROW_O)
    c2 = gl.convert_layout(lam_h * (1.0 / gl.where(l2 == 0.0, 1.0, l2)), ROW_O)
    out = gl.fma(acc2, -c2[:, None], acc1 * r1[:, None])
    out = gl.convert_layout(out, LD)
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LD))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, LD))
    om = start_m + rows
    o = o_ptr + (b * stride_ob + h * stride_oh + om.to(gl.int64) * stride_os)[:, None] + \
        d[None, :]
    gl.store(o, out, mask=((om < N) & (rows < STEP_M))[:, None])
