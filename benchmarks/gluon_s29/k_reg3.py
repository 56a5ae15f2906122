"""Session 29 prototype: the fp32 Gluon entry in 72 KB of shared memory (3 programs an SM)
with every copy a trip ahead: Q1 / Q2 (32 KB) by TMA before the first trip, K1 / K2 in a
two-slot TMA ring (32 KB; tile t + 1's copy issued at trip t's first block barrier, when
every warp is done with tile t - 1's slot), V's tile loaded into registers a trip ahead
(``gl.load``, 16 values a thread, rows past N as zeros) and stored transposed into the one
``vt`` buffer (8 KB) at its trip. A trip over key tile t:

    wait K1, K2 (t); issue S1, S2                                   (async)
    block barrier (trip t - 1 done in every warp: its K slot and vt free)
    TMA K1, K2 (t + 1); registers V (t) -> vt; fence; block barrier
    load V (t + 1) into registers                                   (in flight under the rest)
    softmax 1; O1 *= alpha1; O1 += P1 V; softmax 2; ...; wait for both P @ V
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from ditfuse._attn_gluon import _softmax_step


@gluon.jit
def _load_v(v_ptr, base, start, stride_s, N, BLOCK_N: gl.constexpr, D: gl.constexpr,
            GL: gl.constexpr):
    r = start + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, GL))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, GL))
    p = v_ptr + (base + r.to(gl.int64) * stride_s)[:, None] + d[None, :]
    return gl.load(p, mask=(r < N)[:, None], other=0.0)


@gluon.jit
def _swa_diff_fp32_sm90_kernel(
    q_desc, k_desc, v_desc, q2_desc, k2_desc, o_ptr, lam_ptr, lam, qk_scale,
    N, LEFT, RIGHT, stride_ob, stride_os, stride_oh, stride_lam,
    v_ptr, stride_vb, stride_vs, stride_vh,
    H: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    STEP_M: gl.constexpr, TRIPS: gl.constexpr, LAM_PTR: gl.constexpr,
    TOKEN_MAJOR: gl.constexpr,
):
    DL: gl.constexpr = q_desc.layout
    NB_Q: gl.constexpr = BLOCK_M * D * 4
    NB_K: gl.constexpr = BLOCK_N * D * 4
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_N, 8])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, D, 8])
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=1)
    TPR: gl.constexpr = D // 4
    GL: gl.constexpr = gl.BlockedLayout([1, 4], [32 // TPR, TPR], [4, 1], [1, 0])
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
    v_base = b.to(gl.int64) * stride_vb + h.to(gl.int64) * stride_vh

    q_s = gl.allocate_shared_memory(gl.float32, [1, BLOCK_M, 1, D], DL)
    q2_s = gl.allocate_shared_memory(gl.float32, [1, BLOCK_M, 1, D], DL)
    k_s = gl.allocate_shared_memory(gl.float32, [2, 1, BLOCK_N, 1, D], DL)
    k2_s = gl.allocate_shared_memory(gl.float32, [2, 1, BLOCK_N, 1, D], DL)
    vt_s = gl.allocate_shared_memory(gl.float32, [D, BLOCK_N], VT_SL)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q2_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k2_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(q2_bar, count=1)
    for i in gl.static_range(2):
        mbarrier.init(k_bar.index(i), count=1)
        mbarrier.init(k2_bar.index(i), count=1)
    fence_async_shared()

    lo = gl.maximum(start_m - LEFT, 0)
    hi = gl.minimum(start_m + STEP_M + RIGHT, N)
    trips = gl.cdiv(hi - lo, BLOCK_N)
    mbarrier.expect(q_bar, NB_Q)
    mbarrier.expect(k_bar.index(0), NB_K)
    mbarrier.expect(q2_bar, NB_Q)
    mbarrier.expect(k2_bar.index(0), NB_K)
    tma.async_copy_global_to_shared(q_desc, [b, start_m, h, 0], q_bar, q_s)
    tma.async_copy_global_to_shared(k_desc, [b, lo, h, 0], k_bar.index(0), k_s.index(0))
    tma.async_copy_global_to_shared(q2_desc, [b, start_m, h, 0], q2_bar, q2_s)
    tma.async_copy_global_to_shared(k2_desc, [b, lo, h, 0], k2_bar.index(0), k2_s.index(0))
    if trips > 1:
        mbarrier.expect(k_bar.index(1), NB_K)
        mbarrier.expect(k2_bar.index(1), NB_K)
        tma.async_copy_global_to_shared(k_desc, [b, lo + BLOCK_N, h, 0], k_bar.index(1),
                                        k_s.index(1))
        tma.async_copy_global_to_shared(k2_desc, [b, lo + BLOCK_N, h, 0], k2_bar.index(1),
                                        k2_s.index(1))
    v = _load_v(v_ptr, v_base, lo, stride_vs, N, BLOCK_N, D, GL)

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
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(q2_bar, 0)
    for t in range(trips):
        start_n = lo + t * BLOCK_N
        slot = t % 2
        ph = (t // 2) & 1
        mbarrier.wait(k_bar.index(slot), ph)
        mbarrier.wait(k2_bar.index(slot), ph)
        ks = k_s.index(slot)._reinterpret(gl.float32, [BLOCK_N, D], KV_SL)
        k2s = k2_s.index(slot)._reinterpret(gl.float32, [BLOCK_N, D], KV_SL)
        s1 = warpgroup_mma(q_s, ks.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        s2 = warpgroup_mma(q2_s, k2s.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        gl.thread_barrier()  # trip t - 1 done in every warp: its K slot and vt are free
        if (t > 0) & (t + 1 < trips):
            ns = (t + 1) % 2
            fence_async_shared()
            mbarrier.expect(k_bar.index(ns), NB_K)
            mbarrier.expect(k2_bar.index(ns), NB_K)
            tma.async_copy_global_to_shared(k_desc, [b, start_n + BLOCK_N, h, 0],
                                            k_bar.index(ns), k_s.index(ns))
            tma.async_copy_global_to_shared(k2_desc, [b, start_n + BLOCK_N, h, 0],
                                            k2_bar.index(ns), k2_s.index(ns))
        vt_s.store(gl.permute(v, (1, 0)))
        fence_async_shared()
        gl.thread_barrier()
        if t + 1 < trips:
            v = _load_v(v_ptr, v_base, start_n + BLOCK_N, stride_vs, N, BLOCK_N, D, GL)
        s1 = warpgroup_mma_wait(1, deps=[s1])
        band = (cols[None, :] - (row_lo - start_n)[:, None]).to(gl.uint32, bitcast=True) <= \
            row_span[:, None].to(gl.uint32, bitcast=True)
        p1, a1, m1, l1 = _softmax_step(s1, band, m1, l1, qk_scale)
        acc1 = acc1 * gl.convert_layout(a1, ROW_O)[:, None]
        acc1 = warpgroup_mma(gl.convert_layout(p1, P_L), vt_s.permute((1, 0)), acc1,
                             is_async=True)
        s2 = warpgroup_mma_wait(1, deps=[s2])
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
    out = gl.convert_layout(out, GL)
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, GL))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, GL))
    om = start_m + rows
    o = o_ptr + (b * stride_ob + h * stride_oh + om.to(gl.int64) * stride_os)[:, None] + \
        d[None, :]
    gl.store(o, out, mask=((om < N) & (rows < STEP_M))[:, None])
