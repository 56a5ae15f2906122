"""SAME-L's differential band attention in fp32 on Hopper, written in Gluon (private;
routed by :func:`ditfuse.ops.attention.launch`; design and measurements:
docs/design/attention.md).

The fp32 counterpart of :mod:`ditfuse.kernels.attention_sm90` (read its docstring first):
one warpgroup a 64-query tile, 32-key tiles, Q1 / Q2 and every key tile of the program's
band copied by TMA before the first trip, the score products as tf32 wgmma read straight
from shared memory (both operands K-major: Q's and K's channels are contiguous). P @ V is
where fp32 differs: tf32 wgmma takes its B operand only K-major (PTX: the transposed
shared-memory layouts are for 16-bit types), and V's tile is [keys, channels] with the
channels contiguous, so each trip copies V's tile through registers into ``vt``,
[channels, keys] with the keys contiguous, while the score products run. A trip over key tile t:

    wait for K1, K2 of tile t; issue S1 = Q1 K1^T, S2 = Q2 K2^T     (async)
    wait for V of tile t; V -> registers; block barrier (the last trip's P @ V is done in
        every warp: vt is free); registers -> vt (transposed); fence; block barrier
    wait until 1 group is in flight -> S1 is done
    softmax 1 (while S2 runs); O1 *= alpha1; issue O1 += P1 V
    wait until 1 group is in flight -> S2 is done
    softmax 2 (while O1 runs); O2 *= alpha2; issue O2 += P2 V
    wait for both P @ V (nothing in flight across the back edge: ``attention_sm90``)

Shared memory at SAME-L's 3 key tiles: Q1 / Q2 32 KB, K1 / K2 / V 72 KB, vt 8 KB (112 KB: 2
programs an SM; the output's layout change reuses dead buffers). Faster than the Triton
entry at the TensorRT contract shape; a second vt buffer (1 program an SM) and a 72 KB form
with one K buffer and a two-deep V ring (3 programs an SM, its refills exposed) were slower
(the measurements: docs/design/attention.md).

Contract: fp32 in and out, tensor-core products at tf32 operand precision (as the Triton
kernel's ``tl.dot``), fp32 softmax and accumulation; within ``ACCURACY[fp32]``
of the fp64 formula, as every fp32 launch. Not bitwise the Triton fp32 entry: that one tiles
32 queries on mma.sync with 16-key tiles, so its running maxima, the tf32 rounding of its
probabilities and its sums differ (|difference| ~ 6e-4 on unit-variance inputs at SAME-L).

Scope (``attention.gluon_ok``): sm_90, differential, fp32, head_dim 64, no prologue, the
table's narrow-band fp32 entry (at most 4 key tiles a program), every operand's channels
contiguous and its strides and base 16-byte aligned; any other call runs the Triton kernel.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ditfuse.kernels.attention_sm90 import (
    _band_barriers,
    _band_buffers,
    _band_rows,
    _copy_band,
    _fresh_map,
    _in_band,
    _program_tile,
    _softmax_step,
    _store_out,
    descriptor,  # noqa: F401  (the launcher's, by module)
)
from ditfuse.kernels.attention_sm90 import max_trips as _max_trips

BLOCK_M = 64
BLOCK_N = 32
NUM_WARPS = 4
#: ptxas's register cap: 168 keeps the kernel free of spills inside its loop (179 uncapped)
#: and leaves shared memory as the bound (2 programs an SM at SAME-L's 3 key tiles)
MAXNREG = 168


def max_trips(N: int, left: int, right: int, step: int) -> int:
    """``attention_sm90.max_trips`` for this kernel's key tiles."""
    return _max_trips(N, left, right, step, BLOCK_N)


@gluon.jit
def _swa_diff_fp32_sm90_kernel(
    q_desc,
    k_desc,
    v_desc,
    q2_desc,
    k2_desc,  # TMA descriptors of the (B, N, H, D) views
    o_ptr,  # output view, channel stride 1
    lam_ptr,  # per-head lambda (LAM_PTR), any float dtype
    lam,  # lambda as a Python float (not LAM_PTR)
    qk_scale,  # softmax scale * log2(e)
    N,
    LEFT,
    RIGHT,  # tokens; window (LEFT, RIGHT >= 0)
    stride_ob,
    stride_os,
    stride_oh,
    stride_lam,
    H: gl.constexpr,
    D: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STEP_M: gl.constexpr,  # queries a program stores (attention.query_step)
    TRIPS: gl.constexpr,  # the most key tiles a program visits (max_trips)
    LAM_PTR: gl.constexpr,
    TOKEN_MAJOR: gl.constexpr,  # grid (B*H, query tiles) rather than (tiles, B*H)
):
    DL: gl.constexpr = q_desc.layout
    S_L: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 8]
    )
    O_L: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 8]
    )
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=1)
    # V's tile read down its columns (4 consecutive keys a thread, threads along the
    # channels), so that each thread writes 16 contiguous bytes of a vt row
    VL: gl.constexpr = gl.BlockedLayout([4, 1], [1, 32], [1, 4], [0, 1])
    TPR: gl.constexpr = D // 4
    LD: gl.constexpr = gl.BlockedLayout([1, 4], [32 // TPR, TPR], [4, 1], [1, 0])
    Q_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], gl.float32)
    KV_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], gl.float32)
    VT_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([D, BLOCK_N], gl.float32)
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)

    b, h, start_m = _program_tile(H, STEP_M, TOKEN_MAJOR)
    window = (N, LEFT, RIGHT)
    bufs = _band_buffers(gl.float32, DL, BLOCK_M, BLOCK_N, D, TRIPS)
    vt_s = gl.allocate_shared_memory(gl.float32, [D, BLOCK_N], VT_SL)
    bars = _band_barriers(TRIPS)
    lo, trips = _copy_band(
        (q_desc, q2_desc),
        (k_desc, k2_desc, v_desc),
        bufs,
        bars,
        (b, h, start_m),
        window,
        BLOCK_N=BLOCK_N,
        STEP_M=STEP_M,
        TRIPS=TRIPS,
    )
    q_s, q2_s = bufs[0]
    k_s, k2_s, v_s = bufs[1]
    q_bar, q2_bar = bars[0]
    k_bar, k2_bar, v_bar = bars[1]

    rows = _band_rows(start_m, window, BLOCK_M, BLOCK_N, S_L)
    m1, l1, acc1 = _fresh_map(BLOCK_M, D, ROW_S, O_L)
    m2, l2, acc2 = _fresh_map(BLOCK_M, D, ROW_S, O_L)
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, S_L)

    q_s = q_s._reinterpret(gl.float32, [BLOCK_M, D], Q_SL)
    q2_s = q2_s._reinterpret(gl.float32, [BLOCK_M, D], Q_SL)
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(q2_bar, 0)
    for t in range(trips):
        start_n = lo + t * BLOCK_N
        mbarrier.wait(k_bar.index(t), 0)
        mbarrier.wait(k2_bar.index(t), 0)
        ks = k_s.index(t)._reinterpret(gl.float32, [BLOCK_N, D], KV_SL)
        k2s = k2_s.index(t)._reinterpret(gl.float32, [BLOCK_N, D], KV_SL)
        s1 = warpgroup_mma(q_s, ks.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        s2 = warpgroup_mma(q2_s, k2s.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        # V's tile, transposed into vt while the score products run
        mbarrier.wait(v_bar.index(t), 0)
        v = v_s.index(t)._reinterpret(gl.float32, [BLOCK_N, D], KV_SL).load(VL)
        gl.thread_barrier()  # every warp is past the previous trip's P @ V (vt is free)
        vt_s.store(gl.permute(v, (1, 0)))
        fence_async_shared()
        gl.thread_barrier()
        s1 = warpgroup_mma_wait(1, deps=[s1])
        band = _in_band(rows, start_n)
        p1, a1, m1, l1 = _softmax_step(s1, band, m1, l1, qk_scale)
        acc1 = acc1 * gl.convert_layout(a1, ROW_O)[:, None]
        acc1 = warpgroup_mma(gl.convert_layout(p1, P_L), vt_s.permute((1, 0)), acc1, is_async=True)
        s2 = warpgroup_mma_wait(1, deps=[s2])
        p2, a2, m2, l2 = _softmax_step(s2, band, m2, l2, qk_scale)
        acc2 = acc2 * gl.convert_layout(a2, ROW_O)[:, None]
        acc2 = warpgroup_mma(gl.convert_layout(p2, P_L), vt_s.permute((1, 0)), acc2, is_async=True)
        acc1, acc2 = warpgroup_mma_wait(0, deps=[acc1, acc2])

    _store_out(
        (acc1, acc2),
        (l1, l2),
        (lam_ptr, lam, stride_lam),
        o_ptr,
        (stride_ob, stride_os, stride_oh),
        (b, h, start_m),
        N,
        LD=LD,
        STEP_M=STEP_M,
        LAM_PTR=LAM_PTR,
    )
