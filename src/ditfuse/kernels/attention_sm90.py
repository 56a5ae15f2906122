"""SAME-L's differential band attention on Hopper, written in Gluon (private; routed by
:func:`ditfuse.ops.attention.launch`; design and measurements: docs/design/attention.md).

Triton's ``tl.dot`` waits on each wgmma right after issuing it (``wgmma.wait_group 0``
in its sm_90 builds), so the kernel of :mod:`ditfuse.kernels.attention`
runs each score product, softmax and P @ V one after another. Gluon places the waits by
hand: with two attention maps a trip can keep one map's tensor-core work in flight while
the other's softmax runs (FlashAttention-3's intra-warpgroup overlap, with the second map
as the partner). A program copies Q1, Q2 and every key tile of its band (``TRIPS`` of
them, one shared-memory buffer each: no ring to refill) by TMA before its first trip, one
mbarrier a tile and tensor; a trip over key tile t (wgmma groups complete in issue order):

    wait for K1, K2, V of tile t                      (mbarriers)
    issue S1 = Q1 K1^T, S2 = Q2 K2^T                  (async)
    wait until 1 group is in flight -> S1 is done
    softmax 1 (while S2 runs); O1 *= alpha1; issue O1 += P1 V
    wait until 1 group is in flight -> S2 is done
    softmax 2 (while O1 runs); O2 *= alpha2; issue O2 += P2 V
    wait for both P @ V

The last wait keeps every wgmma inside its trip. ptxas pipelines wgmma only where no
non-wgmma instruction reads an accumulator whose wgmma is in flight; a product left in
flight across the loop's back edge (O1 / O2 retired by the next trip's first wait) fails
its analysis, and it then serializes every wgmma of the kernel
(``ptxas -v``: C7514; every HGMMA followed by ``WARPGROUP.DEPBAR.LE gsb0, 0x0``). TMA
instead of cp.async: one thread issues a tile's copies (no per-thread address arithmetic,
no block barrier a trip), and the kernel fits 128 registers with no spills, so 4 programs
an SM (52 KB of shared memory at SAME-L's 3 tiles). docs/design/attention.md has the
measurements; tests/test_attention_gluon.py builds this kernel for sm_90
and checks the pipeline ptxas keeps (no C7514), TMA copies, registers and shared memory.

Contract: **bitwise** the Triton kernel's output at the launch it replaces -- the table's
SAME-L 16-bit entry (64-query tiles storing ``STEP_M``, 32-key tiles from the tile's first
key, 4 warps): the same tiles, the same wgmma shapes and accumulation (``acc * alpha`` then
the product into it), the same softmax arithmetic (fp32, ``ex2.approx.ftz``, running max
from -FLT_MAX, the band as one unsigned compare), the same epilogue (per-row reciprocals,
one fma) with fp contraction off. TMA zero-fills the rows of a box past N, as the Triton
kernel's masked loads do. Checked on an sm_90 GPU by tests/test_attention_gluon.py.

Scope (``attention.gluon_ok``): sm_90, differential, bf16 / fp16, head_dim 64, no prologue,
the table's narrow-band entry (at most 4 key tiles a program), every operand's channels
contiguous and its strides and base 16-byte aligned (TMA descriptors of the 4-D views);
any other call runs the Triton kernel. Gluon does not run under Triton's interpreter: the
CPU tests compile it for sm_90.

fp32 descriptors compile the same pipeline on tf32 wgmma, V's tile copied each trip into
a transposed buffer (``TF32``): :mod:`ditfuse.kernels.attention_sm90_fp32` has its
settings and contract.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ditfuse.kernels.attention import _softmax_step

BLOCK_M = 64
BLOCK_N = 32
NUM_WARPS = 4
#: ptxas's register cap: the kernel fits 128 with no spills, 4 programs an SM (faster than
#: uncapped at 3 an SM: docs/design/attention.md)
MAXNREG = 128


def max_trips(N: int, left: int, right: int, step: int, block_n: int = BLOCK_N) -> int:
    """Key tiles of ``block_n`` a program visits at most: its stored queries' band spans at
    most ``step + left + right`` keys from its first, and at most N (``left`` / ``right``
    >= 0, as the launcher clamps them)."""
    return max(1, -(-min(step + left + right, N) // block_n))


def descriptor(t, block_rows: int):
    """The TMA descriptor of a (B, N, H, D) view: boxes of one head's ``block_rows``
    tokens, 128-byte swizzled (the wgmma operand layout; fp32 rows of 64 channels are two
    128-byte atoms, which Triton copies as two boxes)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    return TensorDescriptor(
        t,
        list(t.shape),
        list(t.stride()),
        [1, block_rows, 1, t.shape[3]],
        _LAYOUTS[t.element_size()],
    )


#: the boxes' shared-memory layouts by element size (bytes)
_LAYOUTS = {
    n: gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8 * n, rank=4) for n in (2, 4)
}


@gluon.jit
def _copy3(descs, b, row, h, bars, bufs, NBYTES: gl.constexpr):
    """TMA of three boxes (batch b, tokens from ``row``, head h) of the descriptors ``descs``
    into the buffers ``bufs``, each arriving on its mbarrier of ``bars``; the expects first,
    then the copies (Gluon's
    shared-memory barrier analysis puts a block barrier between copies that arrive on one
    mbarrier, and more between interleaved expects and copies: 12 ``BAR.SYNC`` in the
    SAME-L build against 17 interleaved and 23 with one mbarrier a tile)."""
    d0, d1, d2 = descs
    bar0, bar1, bar2 = bars
    s0, s1, s2 = bufs
    mbarrier.expect(bar0, NBYTES)
    mbarrier.expect(bar1, NBYTES)
    mbarrier.expect(bar2, NBYTES)
    tma.async_copy_global_to_shared(d0, [b, row, h, 0], bar0, s0)
    tma.async_copy_global_to_shared(d1, [b, row, h, 0], bar1, s1)
    tma.async_copy_global_to_shared(d2, [b, row, h, 0], bar2, s2)


@gluon.jit
def _store_out(
    accs,
    ls,
    lams,
    o_ptr,
    o_strides,
    tile,
    N,
    LD: gl.constexpr,
    STEP_M: gl.constexpr,
    LAM_PTR: gl.constexpr,
):
    """The epilogue of both SAME-L kernels: ``acc1 / l1 - lam * (acc2 / l2)`` as per-row
    reciprocals and one fma, through layout ``LD`` (shared memory) to coalesced stores of
    the tile's first ``STEP_M`` rows below N. ``lams``: (lam_ptr, lam, lam_ptr's stride);
    ``o_strides``: the output's (batch, token, head) strides; ``tile``: (b, h, start_m)."""
    acc1, acc2 = accs
    l1, l2 = ls
    lam_ptr, lam, stride_lam = lams
    stride_ob, stride_os, stride_oh = o_strides
    b, h, start_m = tile
    BLOCK_M: gl.constexpr = acc1.shape[0]
    D: gl.constexpr = acc1.shape[1]
    ROW_O: gl.constexpr = gl.SliceLayout(1, acc1.type.layout)
    b = b.to(gl.int64)
    h = h.to(gl.int64)
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
    o = o_ptr + (b * stride_ob + h * stride_oh + om.to(gl.int64) * stride_os)[:, None] + d[None, :]
    gl.store(o, out, mask=((om < N) & (rows < STEP_M))[:, None])


@gluon.jit
def _program_tile(H: gl.constexpr, STEP_M: gl.constexpr, TOKEN_MAJOR: gl.constexpr):
    """This program's (batch, head, first query): grid (B*H, query tiles) when
    ``TOKEN_MAJOR``, else (query tiles, B*H)."""
    if TOKEN_MAJOR:
        bh = gl.program_id(0)
        start_m = gl.program_id(1) * STEP_M
    else:
        start_m = gl.program_id(0) * STEP_M
        bh = gl.program_id(1)
    return bh // H, bh % H, start_m


@gluon.jit
def _band_buffers(
    dtype: gl.constexpr,
    DL: gl.constexpr,
    BLOCK_M: gl.constexpr,
    BLOCK_N: gl.constexpr,
    D: gl.constexpr,
    TRIPS: gl.constexpr,
):
    """Shared memory for Q1 / Q2's boxes and ``TRIPS`` boxes each of K1, K2 and V (a buffer
    a key tile: no ring to refill), in the descriptors' 4-D box layout ``DL``."""
    q_s = gl.allocate_shared_memory(dtype, [1, BLOCK_M, 1, D], DL)
    q2_s = gl.allocate_shared_memory(dtype, [1, BLOCK_M, 1, D], DL)
    k_s = gl.allocate_shared_memory(dtype, [TRIPS, 1, BLOCK_N, 1, D], DL)
    k2_s = gl.allocate_shared_memory(dtype, [TRIPS, 1, BLOCK_N, 1, D], DL)
    v_s = gl.allocate_shared_memory(dtype, [TRIPS, 1, BLOCK_N, 1, D], DL)
    return (q_s, q2_s), (k_s, k2_s, v_s)


@gluon.jit
def _mbarriers(shape: gl.constexpr):
    """Uninitialized mbarriers of ``shape`` in shared memory."""
    return gl.allocate_shared_memory(gl.int64, shape, mbarrier.MBarrierLayout())


@gluon.jit
def _barrier_ring(N: gl.constexpr, COUNTS: gl.constexpr):
    """Three arrays of ``N`` mbarriers (a ring of N stages, three barriers a stage), stage by
    stage initialized with the arrive counts ``COUNTS``, then fenced; also the barriers of
    :mod:`ditfuse.kernels.attention_fp8_ws`."""
    a = _mbarriers([N, 1])
    b = _mbarriers([N, 1])
    c = _mbarriers([N, 1])
    for i in gl.static_range(N):
        mbarrier.init(a.index(i), count=COUNTS[0])
        mbarrier.init(b.index(i), count=COUNTS[1])
        mbarrier.init(c.index(i), count=COUNTS[2])
    fence_async_shared()
    return a, b, c


@gluon.jit
def _band_barriers(TRIPS: gl.constexpr):
    """An mbarrier for each box of ``_band_buffers``, initialized and fenced (each completes
    once: phase 0)."""
    q_bar = _mbarriers([1])
    q2_bar = _mbarriers([1])
    mbarrier.init(q_bar, count=1)
    mbarrier.init(q2_bar, count=1)
    return (q_bar, q2_bar), _barrier_ring(TRIPS, (1, 1, 1))


@gluon.jit
def _copy_band(
    q_descs,
    kv_descs,
    bufs,
    bars,
    tile,
    window,
    BLOCK_N: gl.constexpr,
    STEP_M: gl.constexpr,
    TRIPS: gl.constexpr,
):
    """Issues every TMA copy of a program before its first trip: Q1 / Q2's boxes and the key
    tiles of the band of its stored queries, from its first key (a box's rows past N arrive
    as zeros). ``bufs``, ``bars``: ``_band_buffers``' and ``_band_barriers``' pairs;
    ``tile``: (b, h, start_m); ``window``: (N, LEFT, RIGHT). Returns the first key and the
    number of key tiles."""
    q_s, q2_s = bufs[0]
    k_s, k2_s, v_s = bufs[1]
    q_bar, q2_bar = bars[0]
    k_bar, k2_bar, v_bar = bars[1]
    b, h, start_m = tile
    N, LEFT, RIGHT = window
    EB: gl.constexpr = q_s.dtype.primitive_bitwidth // 8  # bytes an element
    D: gl.constexpr = q_s.shape[3]
    lo = gl.maximum(start_m - LEFT, 0)
    hi = gl.minimum(start_m + STEP_M + RIGHT, N)
    trips = gl.cdiv(hi - lo, BLOCK_N)
    mbarrier.expect(q_bar, q_s.shape[1] * D * EB)
    mbarrier.expect(q2_bar, q_s.shape[1] * D * EB)
    tma.async_copy_global_to_shared(q_descs[0], [b, start_m, h, 0], q_bar, q_s)
    tma.async_copy_global_to_shared(q_descs[1], [b, start_m, h, 0], q2_bar, q2_s)
    for t in gl.static_range(TRIPS):
        if t < trips:
            _copy3(
                kv_descs,
                b,
                lo + t * BLOCK_N,
                h,
                (k_bar.index(t), k2_bar.index(t), v_bar.index(t)),
                (k_s.index(t), k2_s.index(t), v_s.index(t)),
                BLOCK_N * D * EB,
            )
    return lo, trips


@gluon.jit
def _band_rows(start_m, window, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, S_L: gl.constexpr):
    """Each query row's band [i - LEFT, min(i + RIGHT, N - 1)] as its first key and width
    (rows past N are never stored), and the score tile's column index (layout ``S_L``);
    ``window``: (N, LEFT, RIGHT)."""
    N, LEFT, RIGHT = window
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, S_L))
    row_lo = offs_m - LEFT
    row_span = gl.minimum(offs_m + RIGHT, N - 1) - row_lo
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, S_L))
    return row_lo, row_span, cols


@gluon.jit
def _in_band(rows, start_n):
    """The key tile from ``start_n``'s band mask: j - lo_i in [0, span_i] as one unsigned
    compare, on the tile's column index (``rows``: ``_band_rows``)."""
    row_lo, row_span, cols = rows
    return (cols[None, :] - (row_lo - start_n)[:, None]).to(gl.uint32, bitcast=True) <= row_span[
        :, None
    ].to(gl.uint32, bitcast=True)


@gluon.jit
def _fresh_map(BLOCK_M: gl.constexpr, D: gl.constexpr, ROW_S: gl.constexpr, O_L: gl.constexpr):
    """One map's running max (from -FLT_MAX), sum and output accumulator before the first
    key tile."""
    m = gl.full([BLOCK_M], -3.4028234663852886e38, gl.float32, ROW_S)
    l_i = gl.zeros([BLOCK_M], gl.float32, ROW_S)
    acc = gl.zeros([BLOCK_M, D], gl.float32, O_L)
    return m, l_i, acc


@gluon.jit
def _swa_diff_sm90_kernel(
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
    dtype: gl.constexpr = q_desc.dtype
    # fp32 runs tf32 wgmma, whose B operand is K-major only (PTX: the transposed
    # shared-memory layouts are for 16-bit types): V's tile, [keys, channels] with the
    # channels contiguous, is copied each trip through registers into vt, [channels, keys]
    TF32: gl.constexpr = dtype == gl.float32
    BITS: gl.constexpr = dtype.primitive_bitwidth
    DL: gl.constexpr = q_desc.layout  # the descriptors' 4-D box layout (128-byte swizzle)
    # one warpgroup; the score tile [BLOCK_M, BLOCK_N] and the output [BLOCK_M, D] in wgmma
    # accumulator layouts (32 bytes of K an instruction), P as a register A operand of the
    # output's wgmma
    S_L: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 256 // BITS]
    )
    O_L: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 256 // BITS]
    )
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=32 // BITS)
    # the output's stores: 16-byte pieces (EPS elements), D / EPS threads a row
    EPS: gl.constexpr = 128 // BITS
    TPR: gl.constexpr = D // EPS
    LD: gl.constexpr = gl.BlockedLayout([1, EPS], [32 // TPR, TPR], [4, 1], [1, 0])
    # fp32: V's tile read down its columns (4 consecutive keys a thread, threads along the
    # channels), so that each thread writes 16 contiguous bytes of a vt row
    VL: gl.constexpr = gl.BlockedLayout([4, 1], [1, 32], [1, 4], [0, 1])
    # the 2-D views of the boxes the wgmma reads (the same bytes: the unit dims add nothing)
    Q_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, D], dtype)
    KV_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D], dtype)
    VT_SL: gl.constexpr = gl.NVMMASharedLayout.get_default_for([D, BLOCK_N], dtype)
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)

    b, h, start_m = _program_tile(H, STEP_M, TOKEN_MAJOR)
    window = (N, LEFT, RIGHT)
    bufs = _band_buffers(dtype, DL, BLOCK_M, BLOCK_N, D, TRIPS)
    if TF32:
        vt_s = gl.allocate_shared_memory(dtype, [D, BLOCK_N], VT_SL)
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

    q_s = q_s._reinterpret(dtype, [BLOCK_M, D], Q_SL)
    q2_s = q2_s._reinterpret(dtype, [BLOCK_M, D], Q_SL)
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(q2_bar, 0)
    for t in range(trips):
        start_n = lo + t * BLOCK_N
        mbarrier.wait(k_bar.index(t), 0)  # each barrier completes once: phase 0
        mbarrier.wait(k2_bar.index(t), 0)
        if not TF32:
            mbarrier.wait(v_bar.index(t), 0)
        ks = k_s.index(t)._reinterpret(dtype, [BLOCK_N, D], KV_SL)
        k2s = k2_s.index(t)._reinterpret(dtype, [BLOCK_N, D], KV_SL)
        if not TF32:
            vs = v_s.index(t)._reinterpret(dtype, [BLOCK_N, D], KV_SL)
        s1 = warpgroup_mma(q_s, ks.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        s2 = warpgroup_mma(q2_s, k2s.permute((1, 0)), zero_s, use_acc=False, is_async=True)
        if TF32:
            # V's tile, transposed into vt while the score products run
            mbarrier.wait(v_bar.index(t), 0)
            v = v_s.index(t)._reinterpret(dtype, [BLOCK_N, D], KV_SL).load(VL)
            gl.thread_barrier()  # every warp is past the previous trip's P @ V (vt is free)
            vt_s.store(gl.permute(v, (1, 0)))
            fence_async_shared()
            gl.thread_barrier()
            vs = vt_s.permute((1, 0))
        s1 = warpgroup_mma_wait(1, deps=[s1])
        band = _in_band(rows, start_n)
        p1, a1, m1, l1 = _softmax_step(s1, band, m1, l1, qk_scale)
        acc1 = acc1 * gl.convert_layout(a1, ROW_O)[:, None]
        acc1 = warpgroup_mma(gl.convert_layout(p1.to(dtype), P_L), vs, acc1, is_async=True)
        s2 = warpgroup_mma_wait(1, deps=[s2])
        p2, a2, m2, l2 = _softmax_step(s2, band, m2, l2, qk_scale)
        acc2 = acc2 * gl.convert_layout(a2, ROW_O)[:, None]
        acc2 = warpgroup_mma(gl.convert_layout(p2.to(dtype), P_L), vs, acc2, is_async=True)
        # nothing in flight across the back edge (else ptxas serializes every wgmma)
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
