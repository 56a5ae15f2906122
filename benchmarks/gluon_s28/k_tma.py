"""Session 28 prototype (benchmarks/attn_gluon_s28_ab.py; NOTES.md "Session 28"): k_rowptr with TMA copies: one mbarrier a ring stage.

Otherwise ``ditfuse._attn_gluon``'s kernel of its time (its contract: bitwise the Triton kernel).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from ditfuse._attn_gluon import _ex2, _softmax_step  # noqa: F401 (used by the kernel)

#: cp.async ring depth: 4 measured fastest (H200, benchmarks/logs/s27/b: 59.0 us at SAME-L
#: 8704 bf16 against 60.2 with 3 and 70.3 with 5, whose 76 KB of shared memory a program
#: leave 2 programs an SM instead of 3)
STAGES = 4
BLOCK_M = 64
BLOCK_N = 32
NUM_WARPS = 4


@gluon.jit
def _row_ptrs(ptr, base, rows, stride_s, D: gl.constexpr, LD: gl.constexpr):
    """Pointers to ``rows`` of a (N, D) slice at int64 offset ``base`` (layout LD)."""
    d = gl.arange(0, D, layout=gl.SliceLayout(0, LD))
    return ptr + (base + rows.to(gl.int64) * stride_s)[:, None] + d[None, :]


@gluon.jit
def _copy_tile(k_s, k2_s, v_s, stage, kp, k2p, vp, step_k, step_k2, step_v, t, rows, N,
               BLOCK_N: gl.constexpr):
    """cp.async of key tile t (rows ``rows + t * BLOCK_N``) of K1, K2, V, whose tile-0
    pointers are ``kp``, ``k2p``, ``vp`` and int64 tile steps ``step_*``; rows past N are
    zero-filled (the copy's source size 0)."""
    m = (rows < N - t * BLOCK_N)[:, None]
    async_copy.async_copy_global_to_shared(k_s.index(stage), kp + t * step_k, mask=m)
    async_copy.async_copy_global_to_shared(k2_s.index(stage), k2p + t * step_k2, mask=m)
    async_copy.async_copy_global_to_shared(v_s.index(stage), vp + t * step_v, mask=m)


@gluon.jit
def _tma_tile(k_s, k2_s, v_s, bars, stage, k_desc, k2_desc, v_desc, b, h, start_n,
              BLOCK_N: gl.constexpr, D: gl.constexpr):
    bar = bars.index(stage)
    mbarrier.expect(bar, 3 * BLOCK_N * D * 2)
    tma.async_copy_global_to_shared(k_desc, [b, start_n, h, 0], bar, k_s.index(stage))
    tma.async_copy_global_to_shared(k2_desc, [b, start_n, h, 0], bar, k2_s.index(stage))
    tma.async_copy_global_to_shared(v_desc, [b, start_n, h, 0], bar, v_s.index(stage))


@gluon.jit
def _swa_diff_sm90_kernel(
    q_ptr, k_ptr, v_ptr, q2_ptr, k2_ptr,  # TMA descriptors of the (B, N, H, D) views
    o_ptr,                                # output view, channel stride 1
    lam_ptr,                              # per-head lambda (LAM_PTR), any float dtype
    lam,                                  # lambda as a Python float (not LAM_PTR)
    qk_scale,                             # softmax scale * log2(e)
    N, LEFT, RIGHT,                       # tokens; window (LEFT, RIGHT >= 0)
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_q2b, stride_q2s, stride_q2h,
    stride_k2b, stride_k2s, stride_k2h, stride_ob, stride_os, stride_oh,
    stride_lam,
    H: gl.constexpr, D: gl.constexpr,
    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    STEP_M: gl.constexpr,                 # queries a program stores (attention.query_step)
    STAGES: gl.constexpr,                 # cp.async ring depth (>= 2)
    LAM_PTR: gl.constexpr,
    TOKEN_MAJOR: gl.constexpr,            # grid (B*H, query tiles) rather than (tiles, B*H)
):
    dtype: gl.constexpr = q_ptr.dtype
    DL: gl.constexpr = q_ptr.layout
    # one warpgroup; the score tile [BLOCK_M, BLOCK_N] and the output [BLOCK_M, D] in wgmma
    # accumulator layouts, P as a register A operand of the output's wgmma
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_N, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, D, 16])
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    # global <-> shared: 16-byte pieces, D / 8 threads a row
    TPR: gl.constexpr = D // 8
    LD: gl.constexpr = gl.BlockedLayout([1, 8], [32 // TPR, TPR], [4, 1], [1, 0])
    Q_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], dtype)
    KV_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], dtype)
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)

    if TOKEN_MAJOR:
        bh = gl.program_id(0)
        start_m = gl.program_id(1) * STEP_M
    else:
        start_m = gl.program_id(0) * STEP_M
        bh = gl.program_id(1)
    b = (bh // H).to(gl.int64)
    h = (bh % H).to(gl.int64)
    k_base = b * stride_kb + h * stride_kh
    k2_base = b * stride_k2b + h * stride_k2h
    v_base = b * stride_vb + h * stride_vh

    q_s = gl.allocate_shared_memory(dtype, [1, BLOCK_M, 1, D], DL)
    q2_s = gl.allocate_shared_memory(dtype, [1, BLOCK_M, 1, D], DL)
    k_s = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_N, 1, D], DL)
    k2_s = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_N, 1, D], DL)
    v_s = gl.allocate_shared_memory(dtype, [STAGES, 1, BLOCK_N, 1, D], DL)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    qbar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(qbar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(i), count=1)
    fence_async_shared()

    # the key tiles of the band of this tile's stored queries, from its first key
    lo = gl.maximum(start_m - LEFT, 0)
    hi = gl.minimum(start_m + STEP_M + RIGHT, N)
    trips = gl.cdiv(hi - lo, BLOCK_N)
    bi = b.to(gl.int32)
    hi32 = h.to(gl.int32)

    mbarrier.expect(qbar, 2 * BLOCK_M * D * 2)
    tma.async_copy_global_to_shared(q_ptr, [bi, start_m, hi32, 0], qbar, q_s)
    tma.async_copy_global_to_shared(q2_ptr, [bi, start_m, hi32, 0], qbar, q2_s)
    for t in gl.static_range(STAGES - 1):
        if t < trips:
            _tma_tile(k_s, k2_s, v_s, bars, t, k_ptr, k2_ptr, v_ptr, bi, hi32,
                      lo + t * BLOCK_N, BLOCK_N, D)

    offs_m = start_m + gl.arange(0, BLOCK_M, layout=ROW_S)
    # each row's band [i - LEFT, min(i + RIGHT, N - 1)] as its first key and width (rows
    # past N are never stored)
    row_lo = offs_m - LEFT
    row_span = gl.minimum(offs_m + RIGHT, N - 1) - row_lo
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_L))
    m1 = gl.full([BLOCK_M], -3.4028234663852886e38, gl.float32, ROW_S)  # -FLT_MAX
    m2 = gl.full([BLOCK_M], -3.4028234663852886e38, gl.float32, ROW_S)
    l1 = gl.zeros([BLOCK_M], gl.float32, ROW_S)
    l2 = gl.zeros([BLOCK_M], gl.float32, ROW_S)
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, S_L)
    acc1 = gl.zeros([BLOCK_M, D], gl.float32, O_L)
    acc2 = gl.zeros([BLOCK_M, D], gl.float32, O_L)

    q_s = q_s._reinterpret(dtype, [BLOCK_M, D], Q_SL)
    q2_s = q2_s._reinterpret(dtype, [BLOCK_M, D], Q_SL)
    mbarrier.wait(qbar, 0)
    for t in range(trips):
        stage = t % STAGES
        start_n = lo + t * BLOCK_N
        mbarrier.wait(bars.index(stage), (t // STAGES) & 1)
        ks = k_s.index(stage)._reinterpret(dtype, [BLOCK_N, D], KV_SL)
        k2s = k2_s.index(stage)._reinterpret(dtype, [BLOCK_N, D], KV_SL)
        vs = v_s.index(stage)._reinterpret(dtype, [BLOCK_N, D], KV_SL)
        s1 = warpgroup_mma(q_s, ks.permute((1, 0)), zero_s, use_acc=False,
                           is_async=True)
        s2 = warpgroup_mma(q2_s, k2s.permute((1, 0)), zero_s, use_acc=False,
                           is_async=True)
        s1 = warpgroup_mma_wait(1, deps=[s1])
        # every product that read the stage trip t-1 used is done (its last wait): refill it
        nt = t + STAGES - 1
        if nt < trips:
            _tma_tile(k_s, k2_s, v_s, bars, nt % STAGES, k_ptr, k2_ptr, v_ptr, bi, hi32,
                      lo + nt * BLOCK_N, BLOCK_N, D)

        # j - lo_i in [0, span_i] as one unsigned compare, on the tile's column index
        band = (cols[None, :] - (row_lo - start_n)[:, None]).to(gl.uint32, bitcast=True) <= \
            row_span[:, None].to(gl.uint32, bitcast=True)
        p1, a1, m1, l1 = _softmax_step(s1, band, m1, l1, qk_scale)
        acc1 = acc1 * gl.convert_layout(a1, ROW_O)[:, None]
        acc1 = warpgroup_mma(gl.convert_layout(p1.to(dtype), P_L), vs, acc1,
                             is_async=True)
        s2 = warpgroup_mma_wait(1, deps=[s2])
        p2, a2, m2, l2 = _softmax_step(s2, band, m2, l2, qk_scale)
        acc2 = acc2 * gl.convert_layout(a2, ROW_O)[:, None]
        acc2 = warpgroup_mma(gl.convert_layout(p2.to(dtype), P_L), vs, acc2,
                             is_async=True)
        # nothing in flight across the back edge (else ptxas serializes every wgmma)
        acc1, acc2 = warpgroup_mma_wait(0, deps=[acc1, acc2])

    if LAM_PTR:
        lam_h = gl.load(lam_ptr + h * stride_lam).to(gl.float32)
    else:
        lam_h = lam
    # rows past N have l = 0 and are not stored; any other row's sum is >= 1
    r1 = gl.convert_layout(1.0 / gl.where(l1 == 0.0, 1.0, l1), ROW_O)
    c2 = gl.convert_layout(lam_h * (1.0 / gl.where(l2 == 0.0, 1.0, l2)), ROW_O)
    out = gl.fma(acc2, -c2[:, None], acc1 * r1[:, None])
    # through shared memory to 16-byte stores
    out = gl.convert_layout(out.to(o_ptr.dtype.element_ty), LD)
    rows = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, LD))
    d = gl.arange(0, D, layout=gl.SliceLayout(0, LD))
    om = start_m + rows
    o = o_ptr + (b * stride_ob + h * stride_oh + om.to(gl.int64) * stride_os)[:, None] + \
        d[None, :]
    gl.store(o, out, mask=((om < N) & (rows < STEP_M))[:, None])
