"""Session 29 prototype: the fp32 Gluon entry as a persistent kernel. 2 programs an SM (the
112 KB of buffers) loop over the query tiles (``TOKEN_MAJOR``: every head of a few query
tiles at once, whole token rows from DRAM; else head-major: a few heads' neighbouring tiles); a program copies the next tile's K1 / K2 / V of slot t
as soon as every warp is done with the current tile's slot t (the next trip's first block
barrier) and its Q1 / Q2 after the last trip, so the next tile's copies run under the current
tile's trips and epilogue. An mbarrier completes once a tile it is armed in: the phases of
the key slots are a bit mask. The output is stored straight from the wgmma accumulator
layout (8-byte pieces, full 32-byte sectors): a layout change through shared memory would
need 16 KB of its own here (no buffer is ever dead).
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from ditfuse._attn_gluon import _softmax_step
from ditfuse._attn_gluon_fp32 import _copy3


@gluon.jit
def _swa_diff_fp32_sm90_kernel(
    q_desc, k_desc, v_desc, q2_desc, k2_desc, o_ptr, lam_ptr, lam, qk_scale,
    N, LEFT, RIGHT, stride_ob, stride_os, stride_oh, stride_lam, N_M, TOTAL, BH,
    H: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    STEP_M: gl.constexpr, TRIPS: gl.constexpr, LAM_PTR: gl.constexpr,
    TOKEN_MAJOR: gl.constexpr,
):
    NB_Q: gl.constexpr = BLOCK_M * D * 4
    NB_K: gl.constexpr = BLOCK_N * D * 4
    DL: gl.constexpr = q_desc.layout
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_N, 8])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, D, 8])
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=1)
    VL: gl.constexpr = gl.BlockedLayout([4, 1], [1, 32], [1, 4], [0, 1])
    Q_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], gl.float32)
    KV_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], gl.float32)
    VT_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([D, BLOCK_N], gl.float32)
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)

    q_raw = gl.allocate_shared_memory(gl.float32, [1, BLOCK_M, 1, D], DL)
    q2_raw = gl.allocate_shared_memory(gl.float32, [1, BLOCK_M, 1, D], DL)
    k_s = gl.allocate_shared_memory(gl.float32, [TRIPS, 1, BLOCK_N, 1, D], DL)
    k2_s = gl.allocate_shared_memory(gl.float32, [TRIPS, 1, BLOCK_N, 1, D], DL)
    v_s = gl.allocate_shared_memory(gl.float32, [TRIPS, 1, BLOCK_N, 1, D], DL)
    vt_s = gl.allocate_shared_memory(gl.float32, [D, BLOCK_N], VT_SL)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q2_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bar = gl.allocate_shared_memory(gl.int64, [TRIPS, 1], mbarrier.MBarrierLayout())
    k2_bar = gl.allocate_shared_memory(gl.int64, [TRIPS, 1], mbarrier.MBarrierLayout())
    v_bar = gl.allocate_shared_memory(gl.int64, [TRIPS, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    mbarrier.init(q2_bar, count=1)
    for i in gl.static_range(TRIPS):
        mbarrier.init(k_bar.index(i), count=1)
        mbarrier.init(k2_bar.index(i), count=1)
        mbarrier.init(v_bar.index(i), count=1)
    fence_async_shared()
    q_s = q_raw._reinterpret(gl.float32, [BLOCK_M, D], Q_SL)
    q2_s = q2_raw._reinterpret(gl.float32, [BLOCK_M, D], Q_SL)

    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    # the first tile's copies
    if TOKEN_MAJOR:  # the tiles running at once: every head of a few query tiles
        bh = pid % BH
        start_m = (pid // BH) * STEP_M
    else:
        bh = pid // N_M
        start_m = (pid % N_M) * STEP_M
    b = bh // H
    h = bh % H
    lo = gl.maximum(start_m - LEFT, 0)
    trips = gl.cdiv(gl.minimum(start_m + STEP_M + RIGHT, N) - lo, BLOCK_N)
    mbarrier.expect(q_bar, NB_Q)
    mbarrier.expect(q2_bar, NB_Q)
    tma.async_copy_global_to_shared(q_desc, [b, start_m, h, 0], q_bar, q_raw)
    tma.async_copy_global_to_shared(q2_desc, [b, start_m, h, 0], q2_bar, q2_raw)
    for s0 in gl.static_range(TRIPS):
        if s0 < trips:
            _copy3(k_desc, k2_desc, v_desc, b, lo + s0 * BLOCK_N, h, k_bar.index(s0),
                   k2_bar.index(s0), v_bar.index(s0), k_s.index(s0), k2_s.index(s0),
                   v_s.index(s0), NB_K)

    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_L))
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, S_L)
    rows_o = gl.arange(0, BLOCK_M, layout=ROW_O)
    d_o = gl.arange(0, D, layout=gl.SliceLayout(0, O_L))
    kvp = pid * 0       # bit t: the phase the key slot t's barriers complete next
    it = pid * 0
    for tile in range(pid, TOTAL, nprog):
        if TOKEN_MAJOR:
            bh = tile % BH
            start_m = (tile // BH) * STEP_M
        else:
            bh = tile // N_M
            start_m = (tile % N_M) * STEP_M
        b = bh // H
        h = bh % H
        lo = gl.maximum(start_m - LEFT, 0)
        trips = gl.cdiv(gl.minimum(start_m + STEP_M + RIGHT, N) - lo, BLOCK_N)
        nxt = tile + nprog
        has_next = nxt < TOTAL
        if TOKEN_MAJOR:
            nbh = nxt % BH
            nstart = (nxt // BH) * STEP_M
        else:
            nbh = nxt // N_M
            nstart = (nxt % N_M) * STEP_M
        nb = nbh // H
        nh = nbh % H
        nlo = gl.maximum(nstart - LEFT, 0)
        ntrips = gl.where(has_next,
                          gl.cdiv(gl.minimum(nstart + STEP_M + RIGHT, N) - nlo, BLOCK_N), 0)

        offs_m = start_m + gl.arange(0, BLOCK_M, layout=ROW_S)
        row_lo = offs_m - LEFT
        row_span = gl.minimum(offs_m + RIGHT, N - 1) - row_lo
        m1 = gl.full([BLOCK_M], -3.4028234663852886e38, gl.float32, ROW_S)
        m2 = gl.full([BLOCK_M], -3.4028234663852886e38, gl.float32, ROW_S)
        l1 = gl.zeros([BLOCK_M], gl.float32, ROW_S)
        l2 = gl.zeros([BLOCK_M], gl.float32, ROW_S)
        acc1 = gl.zeros([BLOCK_M, D], gl.float32, O_L)
        acc2 = gl.zeros([BLOCK_M, D], gl.float32, O_L)
        mbarrier.wait(q_bar, it & 1)
        mbarrier.wait(q2_bar, it & 1)
        for t in range(trips):
            start_n = lo + t * BLOCK_N
            ph = (kvp >> t) & 1
            mbarrier.wait(k_bar.index(t), ph)
            mbarrier.wait(k2_bar.index(t), ph)
            ks = k_s.index(t)._reinterpret(gl.float32, [BLOCK_N, D], KV_SL)
            k2s = k2_s.index(t)._reinterpret(gl.float32, [BLOCK_N, D], KV_SL)
            s1 = warpgroup_mma(q_s, ks.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            s2 = warpgroup_mma(q2_s, k2s.permute((1, 0)), zero_s, use_acc=False, is_async=True)
            mbarrier.wait(v_bar.index(t), ph)
            v = v_s.index(t)._reinterpret(gl.float32, [BLOCK_N, D], KV_SL).load(VL)
            gl.thread_barrier()  # every warp is done with trip t - 1: its slot and vt free
            if (t > 0) & (t - 1 < ntrips):
                fence_async_shared()
                _copy3(k_desc, k2_desc, v_desc, nb, nlo + (t - 1) * BLOCK_N, nh,
                       k_bar.index(t - 1), k2_bar.index(t - 1), v_bar.index(t - 1),
                       k_s.index(t - 1), k2_s.index(t - 1), v_s.index(t - 1), NB_K)
            vt_s.store(gl.permute(v, (1, 0)))
            fence_async_shared()
            gl.thread_barrier()
            s1 = warpgroup_mma_wait(1, deps=[s1])
            band = (cols[None, :] - (row_lo - start_n)[:, None]).to(gl.uint32, bitcast=True) \
                <= row_span[:, None].to(gl.uint32, bitcast=True)
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
            kvp = kvp ^ (1 << t)
        # every warp is done with the last trip: the remaining slots and Q1 / Q2 are free
        gl.thread_barrier()
        fence_async_shared()
        if has_next:
            mbarrier.expect(q_bar, NB_Q)
            mbarrier.expect(q2_bar, NB_Q)
            tma.async_copy_global_to_shared(q_desc, [nb, nstart, nh, 0], q_bar, q_raw)
            tma.async_copy_global_to_shared(q2_desc, [nb, nstart, nh, 0], q2_bar, q2_raw)
        for s in gl.static_range(TRIPS):
            if (s >= trips - 1) & (s < ntrips):
                _copy3(k_desc, k2_desc, v_desc, nb, nlo + s * BLOCK_N, nh, k_bar.index(s),
                       k2_bar.index(s), v_bar.index(s), k_s.index(s), k2_s.index(s),
                       v_s.index(s), NB_K)
        it += 1

        b64 = b.to(gl.int64)
        h64 = h.to(gl.int64)
        if LAM_PTR:
            lam_h = gl.load(lam_ptr + h64 * stride_lam).to(gl.float32)
        else:
            lam_h = lam
        r1 = gl.convert_layout(1.0 / gl.where(l1 == 0.0, 1.0, l1), ROW_O)
        c2 = gl.convert_layout(lam_h * (1.0 / gl.where(l2 == 0.0, 1.0, l2)), ROW_O)
        out = gl.fma(acc2, -c2[:, None], acc1 * r1[:, None])
        om = start_m + rows_o
        o = o_ptr + (b64 * stride_ob + h64 * stride_oh + om.to(gl.int64) * stride_os)[:, None] \
            + d_o[None, :]
        gl.store(o, out, mask=((om < N) & (rows_o < STEP_M))[:, None])
