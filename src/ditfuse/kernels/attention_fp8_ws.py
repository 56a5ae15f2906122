"""Warp-specialized 8-bit attention for sm_90, in Gluon (private; the quantizers and the
launch are in :mod:`ditfuse.ops.attention_fp8_ws`, the routing in
:mod:`ditfuse.ops.attention_api`; design and measurements: docs/design/attention_fp8.md).

A program owns 128 queries of one (batch, head) and walks every key tile of 128 keys:

- a **producer warp** copies Q (two 64-row boxes) once, then K and V^T tiles by TMA into a
  ring of ``STAGES`` shared-memory slots, each slot with a K and a V mbarrier; a slot is
  refilled once both consumers released it (an "empty" mbarrier of count 2);
- two **consumer warpgroups**, 64 query rows each, run a trip per two key tiles j, j + 1:
  both ``S = Q K^T`` (int8, int32 accumulation) issued together, one running max over both,
  then ``P_j V_j`` (e4m3, fp32) and the row sum ``P_j @ ones`` issued as wgmmas from P's
  registers *before* tile j + 1's exponentials, whose products are chained onto the same
  accumulators. On Hopper the exponentials (16 a clock an SM) take about as long as the
  8-bit products: a trip of one tile leaves them mostly in sequence, a trip of two puts one
  tile's products under the other's exponentials. The first tile (masked: it may be the
  only, partial one), an odd one left and a partial last one take a trip of their own. The
  warp schedulers also interleave one warpgroup's softmax with the other's products (an
  explicit ping-pong through two mbarriers measured no faster: the design note).

Operands:

- Q int8 with one fp32 scale per token (from the prologue or the op's quantizer); the
  row's scale times the softmax scale and log2(e) is a row constant;
- K int8 with one fp32 scale per 128-key tile of one (batch, head), quantized after the
  (batch, head)'s mean key was subtracted (softmax is invariant to it: the mean adds
  ``q . mean`` to every score of a row): the tile scale is a row constant too, so a score
  costs one FFMA and an exponential;
- V e4m3 with one scale per (batch, head, channel), transposed to ``(B*H*D, S_pad)`` with
  the tokens contiguous (both operands of an 8-bit wgmma are K-major);
- P = 256 * p rounded to e4m3 (the factor keeps small probabilities out of e4m3's
  subnormals).

The int32 scores become fp32 without a conversion instruction: the accumulator starts at
``0x4B400000``, whose bits read as fp32 are ``1.5 * 2^23``, and ``1.5 * 2^23 + s`` is exact
for ``|s| < 2^22`` (an int8 dot over 128 channels is below 2^21).

The row sum is summed from the rounded P on the tensor cores (``P_j`` times an e4m3 tile of
ones in shared memory, accumulated as P V is): numerator and denominator sum the same
values, so equal values of V come out as themselves within the tensor cores' accumulation
(``test_gpu_equal_v_is_v``: one bf16 rounding at most).

P is used in the trip that computes it and never crosses the loop's back edge: an e4m3
tensor carried across it is held a byte a register and rebuilt into the wgmma operand every
trip (two hundred byte moves a trip in the sm_90a build). The row sum on the tensor cores
takes its conversions and adds off the issue slots the exponentials need.

``P @ V`` of each trip (two key tiles, 256 keys) accumulates into a fresh accumulator that
is then added to the fp32 output in registers (``o * alpha + pv``, one FFMA an element):
Hopper's fp8 tensor-core accumulation keeps about 14 bits, enough for the 8 chained k-steps
of a trip, too few for tens of thousands of keys. (A fresh accumulator for each tile of the
pair needs 64 more registers a thread and spills 1.9 KB in the sm_90a build.)

Nothing stays in flight across a trip's back edge (ptxas serializes every wgmma of a kernel
that leaves one there: C7514).
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

from ditfuse.kernels.attention_sm90 import _barrier_ring, _mbarriers
from ditfuse.kernels.element import _ex2

#: queries a consumer warpgroup owns; a program has two
WG_M = gl.constexpr(64)
BLOCK_M = gl.constexpr(128)
BLOCK_N_DEFAULT = 128
#: the accumulator's start: 1.5 * 2^23 as int32 bits, and as fp32
_MAGIC_I = gl.constexpr(0x4B400000)
_MAGIC_F = gl.constexpr(12582912.0)
#: the running max before the first key: finite, so a row's first rescale is exp2(-huge) = 0
_NEG = gl.constexpr(-1.0e30)
_WG0 = gl.constexpr(0)
_WG1 = gl.constexpr(1)


@gluon.jit
def _key_count(keys):
    """The keys a program walks, from ``keys = (S_kv, count, b)``: S_kv, or under a key mask
    (``count`` an int32 pointer; a float one without) the kept keys of batch entry b,
    compacted to the front. Each partition loads it itself. As a loaded value it costs the
    consumers a register: ptxas spills 16 bytes around the masked last tile, once a program,
    none in the key loop (``test_sm90_build``)."""
    S_kv, count_ptr, b = keys
    if count_ptr.dtype.element_ty == gl.int32:
        return gl.load(count_ptr + b)
    else:
        return S_kv


@gluon.jit
def _tiles(S_kv, BLOCK_N: gl.constexpr):
    # at least one: an entry without a key (a key mask keeping none) reads one tile, masked
    return gl.maximum(gl.cdiv(S_kv, BLOCK_N), 1)


@gluon.jit
def _producer(descs, ring, bars, b, h, start_m, vt_row, keys):
    """The TMA warp: Q once, then each key tile's K and V^T into the ring. ``descs``: the Q,
    K and V^T descriptors; ``ring``: the Q, K, V shared buffers; ``bars``: the Q, K-ready,
    V-ready and empty barriers; ``keys``: :func:`_key_count`'s."""
    q_desc, k_desc, vt_desc = descs
    q_s, k_s, v_s, _ones = ring
    q_bar, k_ready, v_ready, empty = bars
    # a partition takes no constexpr arguments: the shapes of the ring carry them
    STAGES: gl.constexpr = k_s.shape[0]
    BLOCK_N: gl.constexpr = k_s.shape[2]
    n_tiles = _tiles(_key_count(keys), BLOCK_N)
    mbarrier.expect(q_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [b, start_m, h, 0], q_bar, q_s.index(0))
    tma.async_copy_global_to_shared(q_desc, [b, start_m + WG_M, h, 0], q_bar, q_s.index(1))
    for j in range(n_tiles):
        slot = j % STAGES
        # a fresh mbarrier reads as phase 1 complete: the first STAGES waits pass
        mbarrier.wait(empty.index(slot), ((j // STAGES) & 1) ^ 1)
        mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            k_desc, [b, j * BLOCK_N, h, 0], k_ready.index(slot), k_s.index(slot)
        )
        mbarrier.expect(v_ready.index(slot), vt_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(
            vt_desc, [vt_row, j * BLOCK_N], v_ready.index(slot), v_s.index(slot)
        )


@gluon.jit
def _a_order(p):
    """P's columns in the order in which the score accumulator already holds them in the
    registers of the 8-bit wgmma's A operand: within each 16 keys, column ``8 hi + 2 q + i``
    of the accumulator is key ``4 q + 2 hi + i`` of the operand. V^T's keys are stored in
    the same order (:func:`ditfuse.kernels.quantize_8bit.key_position`), so P V is
    unchanged and P reaches the A operand without a shuffle."""
    M: gl.constexpr = p.shape[0]
    N: gl.constexpr = p.shape[1]
    return p.reshape([M, N // 16, 2, 4, 2]).permute((0, 1, 3, 2, 4)).reshape([M, N])


@gluon.jit
def _x4(x, ASM: gl.constexpr, CONSTRAINTS: gl.constexpr, DTYPE: gl.constexpr):
    """An elementwise conversion of ``x`` in inline PTX ``ASM``, four values a call."""
    return gl.inline_asm_elementwise(ASM, CONSTRAINTS, [x], dtype=DTYPE.value, is_pure=True, pack=4)


@gluon.jit
def _to_e4m3x4(x):
    """fp32 -> e4m3 (round to nearest even, saturating), four values a register: two
    ``cvt.rn.satfinite.e4m3x2.f32`` and one byte merge (Triton's own conversion unpacks the
    pairs and repacks them byte by byte)."""
    return _x4(
        x,
        "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; "
        "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; mov.b32 $0, {lo, hi}; }",
        "=r,r,r,r,r",
        gl.float8e4nv,
    )


@gluon.jit
def _tile_max(s, g, col_ok, MASKED: gl.constexpr, QK_INT: gl.constexpr):
    """A key tile's row max of the scaled scores. ``s``: the tile's raw scores (``1.5 * 2^23 +
    dot`` for int8 inputs, the dot for e4m3); ``g``: the row's scale in log2 units times the
    tile's key scale (> 0)."""
    if QK_INT:
        base = _MAGIC_F
    else:
        base = 0.0
    s_max = s
    if MASKED:
        s_max = gl.where(col_ok[None, :], s, float("-inf"))
    # g >= 0: max_j((s - base) * g) = (max_j s - base) * g, one multiply a row
    return (gl.max(s_max, 1) - base) * g


@gluon.jit
def _probs(s, g, m_new, col_ok, MASKED: gl.constexpr, QK_INT: gl.constexpr):
    """A key tile's probabilities times 256 (fp32) against the running max ``m_new``."""
    if QK_INT:
        base = _MAGIC_F
    else:
        base = 0.0
    # 256 * p = exp2((s - base) * g - m + 8) in one FFMA an element
    r = 8.0 - m_new - base * g
    x = s * g[:, None] + r[:, None]
    if MASKED:
        # masked after the FFMA: g underflows to 0 for tiny q and k scales, and -inf * 0 is NaN
        x = gl.where(col_ok[None, :], x, float("-inf"))
    return _ex2(x)


@gluon.jit
def _issue_scores(slot, phase, trip):
    """``S = Q K^T`` of the K tile in ring slot ``slot`` issued once it is ready (phase
    ``phase``): the wgmma's token. ``trip``: see :func:`_step`."""
    q_t, k_s, k_ready, s_init = trip[0], trip[1][0], trip[2][0], trip[3][0]
    BLOCK_N: gl.constexpr = k_s.shape[2]
    D: gl.constexpr = k_s.shape[4]
    QK_INT: gl.constexpr = k_s.dtype == gl.int8
    KK_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=D, element_bitwidth=8, rank=2)
    mbarrier.wait(k_ready.index(slot), phase)
    k_t = k_s.index(slot)._reinterpret(k_s.dtype, [BLOCK_N, D], KK_SL)
    return warpgroup_mma(q_t, k_t.permute((1, 0)), s_init, use_acc=QK_INT, is_async=True)


@gluon.jit
def _as_f32(s, QK_INT: gl.constexpr):
    """The int32 score accumulator read as fp32 (its start makes the bits the value)."""
    if QK_INT:
        s = s.to(gl.float32, bitcast=True)
    return s


@gluon.jit
def _issue_pv(p, slot, phase, trip, acc, USE_ACC: gl.constexpr):
    """``p`` (fp32, times 256) rounded to e4m3 in the wgmma A operand's registers, then
    ``P V`` of the slot's V and the row sum ``P @ ones`` issued onto ``acc`` (P V, row sum;
    their zero accumulators without ``USE_ACC``) once V is ready. The row sum is of the
    rounded P, so that it cancels against P V's; every column of the [64, 8] product is
    the sum."""
    bufs, bars, inits = trip[1], trip[2], trip[3]
    v_s, ones_s = bufs[1], bufs[2]
    P_L: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=inits[1].type.layout, k_width=4)
    p8 = _to_e4m3x4(gl.convert_layout(_a_order(p), P_L))
    mbarrier.wait(bars[1].index(slot), phase)
    pv = warpgroup_mma(p8, v_s.index(slot).permute((1, 0)), acc[0], use_acc=USE_ACC, is_async=True)
    ls = warpgroup_mma(p8, ones_s.permute((1, 0)), acc[1], use_acc=USE_ACC, is_async=True)
    return pv, ls


@gluon.jit
def _fold(o, l_i, alpha, pv, ls):
    """The output and row sums rescaled by ``alpha`` and the trip's P V and row sum added."""
    ROW_O: gl.constexpr = gl.SliceLayout(1, o.type.layout)
    alpha_o = gl.convert_layout(alpha, ROW_O)
    l_i = l_i * alpha_o + gl.convert_layout(gl.max(ls, 1), ROW_O)
    o = o * alpha_o[:, None] + pv
    return o, l_i


@gluon.jit
def _step(j, trip, state, MASKED: gl.constexpr):
    """Trip j of a consumer warpgroup: ``S_j = Q K_j^T``, tile j's softmax, then ``P_j V_j``
    and the row sum ``P_j @ ones`` issued together, the output and row sums rescaled and
    folded in. ``trip``: what every trip reads -- the Q tile, the K, V and ones buffers,
    ``bars`` (the ring's K-ready, V-ready and empty barriers), ``inits`` (the scores'
    start, the zero accumulators of P V and of the row sum), the key tile scales, the row
    constants and the key count; ``state``: (running max, output, row sums)."""
    m_i, o, l_i = state
    k_s, empty, inits = trip[1][0], trip[2][2], trip[3]
    kb_ptr, kb_off, c, S_kv = trip[4], trip[5], trip[6], trip[7]
    STAGES: gl.constexpr = k_s.shape[0]
    BLOCK_N: gl.constexpr = k_s.shape[2]
    QK_INT: gl.constexpr = k_s.dtype == gl.int8
    slot = j % STAGES
    phase = (j // STAGES) & 1
    kb = gl.load(kb_ptr + kb_off + j)
    tok = _issue_scores(slot, phase, trip)
    s = _as_f32(warpgroup_mma_wait(0, deps=[tok]), QK_INT)
    cols = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, inits[0].type.layout))
    col_ok = cols < S_kv - j * BLOCK_N
    g = c * kb
    m_new = gl.maximum(m_i, _tile_max(s, g, col_ok, MASKED, QK_INT))
    p = _probs(s, g, m_new, col_ok, MASKED, QK_INT)
    alpha = _ex2(m_i - m_new)
    pv, ls = _issue_pv(p, slot, phase, trip, (inits[1], inits[2]), USE_ACC=False)
    pv, ls = warpgroup_mma_wait(0, deps=[pv, ls])
    mbarrier.arrive(empty.index(slot))
    o, l_i = _fold(o, l_i, alpha, pv, ls)
    return m_new, o, l_i


@gluon.jit
def _pair(j, trip, state):
    """Trips j and j + 1 (both full) as one: both tiles' scores, one running max, tile j's
    P V issued before tile j + 1's exponentials, tile j + 1's P V chained onto it."""
    m_i, o, l_i = state
    k_s, empty, inits = trip[1][0], trip[2][2], trip[3]
    kb_ptr, kb_off, c = trip[4], trip[5], trip[6]
    STAGES: gl.constexpr = k_s.shape[0]
    QK_INT: gl.constexpr = k_s.dtype == gl.int8
    sa = j % STAGES
    pa = (j // STAGES) & 1
    sb = (j + 1) % STAGES
    pb = ((j + 1) // STAGES) & 1
    ga = c * gl.load(kb_ptr + kb_off + j)
    gb = c * gl.load(kb_ptr + kb_off + j + 1)
    ta = _issue_scores(sa, pa, trip)
    tb = _issue_scores(sb, pb, trip)
    s_a = _as_f32(warpgroup_mma_wait(1, deps=[ta]), QK_INT)
    m_a = _tile_max(s_a, ga, None, False, QK_INT)
    s_b = _as_f32(warpgroup_mma_wait(0, deps=[tb]), QK_INT)
    m_new = gl.maximum(gl.maximum(m_i, m_a), _tile_max(s_b, gb, None, False, QK_INT))
    alpha = _ex2(m_i - m_new)
    p_a = _probs(s_a, ga, m_new, None, False, QK_INT)
    acc = _issue_pv(p_a, sa, pa, trip, (inits[1], inits[2]), USE_ACC=False)
    p_b = _probs(s_b, gb, m_new, None, False, QK_INT)
    pv, ls = _issue_pv(p_b, sb, pb, trip, acc, USE_ACC=True)
    pv, ls = warpgroup_mma_wait(0, deps=[pv, ls])
    mbarrier.arrive(empty.index(sa))
    mbarrier.arrive(empty.index(sb))
    o, l_i = _fold(o, l_i, alpha, pv, ls)
    return m_new, o, l_i


@gluon.jit
def _consumer(ring, bars, q_scales, kb_scales, v_scales, out, dims, WG: gl.constexpr):
    """Consumer warpgroup ``WG``: its 64 query rows against every key tile. ``ring``: the Q,
    K, V and ones shared buffers; ``bars``: the Q, K-ready, V-ready and empty barriers; the q
    scales, key tile scales and V scales as (pointer, offset[, row stride]), the output as
    (pointer, offset, row stride, ``ROUND_F16``, ``out8``): a 16-bit pointer, or an e4m3 one
    with (the pointers to V's amax a batch entry, int32 bits (B,), and to the scales
    (B, S_q), the batch entry, the head) -- the 16-bit output rounded to fp16
    (``ROUND_F16``) or bf16 first;
    ``dims``: (S_q, :func:`_key_count`'s keys, the program's first query, softmax scale *
    log2(e))."""
    q_s, k_s, v_s, ones_s = ring
    q_bar, k_ready, v_ready, empty = bars
    qs_ptr, qs_off, stride_qss = q_scales
    kb_ptr, kb_off = kb_scales
    vs_ptr, vs_off = v_scales
    o_ptr, o_off, stride_os, ROUND_F16, out8 = out
    S_q, keys, start_m, c_scale = dims
    BLOCK_N: gl.constexpr = k_s.shape[2]
    D: gl.constexpr = k_s.shape[4]
    QK_INT: gl.constexpr = q_s.dtype == gl.int8
    # Q and K tiles: rows of D bytes, swizzled over D bytes (the TMA boxes' layout)
    KK_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=D, element_bitwidth=8, rank=2)
    S_L: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 32]
    )
    O_L: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 32]
    )
    # the row sum's accumulator: 8 columns, the narrowest wgmma
    L_L: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 8, 32]
    )
    ROW_S: gl.constexpr = gl.SliceLayout(1, S_L)
    ROW_O: gl.constexpr = gl.SliceLayout(1, O_L)
    qk_dtype: gl.constexpr = q_s.dtype

    rows = start_m + WG * WG_M + gl.arange(0, WG_M, layout=ROW_S)
    c = (
        gl.load(qs_ptr + qs_off + rows.to(gl.int64) * stride_qss, mask=rows < S_q, other=1.0)
        * c_scale
    )
    if QK_INT:
        s_init = gl.full([WG_M, BLOCK_N], _MAGIC_I, gl.int32, S_L)
    else:
        s_init = gl.zeros([WG_M, BLOCK_N], gl.float32, S_L)
    zero_o = gl.zeros([WG_M, D], gl.float32, O_L)
    o = gl.zeros([WG_M, D], gl.float32, O_L)
    l_i = gl.zeros([WG_M], gl.float32, ROW_O)
    m_i = gl.full([WG_M], _NEG, gl.float32, ROW_S)
    zero_l = gl.zeros([WG_M, 8], gl.float32, L_L)
    q_t = q_s.index(WG)._reinterpret(qk_dtype, [WG_M, D], KK_SL)
    S_kv = _key_count(keys)
    n_tiles = _tiles(S_kv, BLOCK_N)
    n_full = S_kv // BLOCK_N

    if o_ptr.dtype.element_ty == gl.float8e4nv:
        # the bound the e4m3 epilogue scales by, loaded now: after the key loop its latency
        # would be the epilogue's
        amax_bits = gl.load(out8[0] + out8[2])
    inits = (s_init, zero_o, zero_l)
    trip = (q_t, (k_s, v_s, ones_s), (k_ready, v_ready, empty), inits, kb_ptr, kb_off, c, S_kv)
    state = (m_i, o, l_i)
    mbarrier.wait(q_bar, 0)
    # tile 0 masked: it may be the only, partial, tile
    state = _step(0, trip, state, MASKED=True)
    n_pairs = gl.maximum(n_full - 1, 0) // 2
    for i in range(n_pairs):
        state = _pair(1 + 2 * i, trip, state)
    if 1 + 2 * n_pairs < n_full:
        state = _step(1 + 2 * n_pairs, trip, state, MASKED=False)
    if n_full > 0:
        if n_tiles > n_full:  # the partial last tile
            state = _step(n_full, trip, state, MASKED=True)
    m_i, o, l_i = state

    vs = gl.load(vs_ptr + vs_off + gl.arange(0, D, layout=gl.SliceLayout(0, O_L)))
    l_o = gl.convert_layout(l_i, ROW_O)
    # a row without a key has l = 0: zeros, not 0 / 0 (a NaN row sum stays NaN)
    inv_l = gl.where(l_o == 0.0, 0.0, 1.0 / l_o)
    out = o * inv_l[:, None] * vs[None, :]
    rows_o = start_m + WG * WG_M + gl.arange(0, WG_M, layout=ROW_O)
    d = gl.arange(0, D, layout=gl.SliceLayout(0, O_L))
    ptrs = o_ptr + o_off + rows_o.to(gl.int64)[:, None] * stride_os + d[None, :]
    if o_ptr.dtype.element_ty != gl.float8e4nv:
        gl.store(ptrs, out.to(o_ptr.dtype.element_ty), mask=(rows_o < S_q)[:, None])
    else:
        # e4m3 rows of the 16-bit output, one scale a batch entry: amax is the largest |V|
        # the entry attends, which bounds every output (the row sum is the sum of the rounded
        # P, so a row is a convex combination of V's quantized values): e4m3(x * (448 /
        # amax)), scale amax / 448 (both divisions correctly rounded, as quantize_rows);
        # amax 0: scale 1; a NaN or an infinity in V: zeros and scale NaN. The head-0
        # programs write their rows' scales. (Inline: the same code in a called function
        # failed to build, Triton 3.6.)
        _, os_ptr, b, h = out8
        if ROUND_F16:
            x = out.to(gl.float16).to(gl.float32)
        else:
            x = out.to(gl.bfloat16).to(gl.float32)
        bits = amax_bits + gl.zeros_like(rows_o)
        bad = bits >= 0x7F800000  # the bits of a non-negative infinity or NaN
        zero = bits == 0
        one = gl.full([WG_M], 1.0, gl.float32, ROW_O)
        e4m3_max = gl.full([WG_M], 448.0, gl.float32, ROW_O)
        amax = gl.where(zero | bad, one, bits.to(gl.float32, bitcast=True))
        inv = gl.where(zero, one, gl.where(bad, 0.0, gl.div_rn(e4m3_max, amax)))
        scale = gl.where(bad, float("nan"), gl.where(zero, one, gl.div_rn(amax, e4m3_max)))
        # no clamp: |x| <= amax within the accumulation's rounding, and the conversion
        # saturates (cvt.rn.satfinite, four values a call)
        y = gl.where(bad[:, None], 0.0, x * inv[:, None])
        ok = rows_o < S_q
        gl.store(ptrs, _to_e4m3x4(y), mask=ok[:, None])
        gl.store(os_ptr + b.to(gl.int64) * S_q + rows_o, scale, mask=ok & (h == 0))


@gluon.jit
def _consumer_0(cargs):
    ring, bars, q_scales, kb_scales, v_scales, out, dims = cargs
    _consumer(ring, bars, q_scales, kb_scales, v_scales, out, dims, WG=0)


@gluon.jit
def _consumer_1(cargs):
    ring, bars, q_scales, kb_scales, v_scales, out, dims = cargs
    _consumer(ring, bars, q_scales, kb_scales, v_scales, out, dims, WG=1)


# S_kv not specialized: Triton compiles an integer argument equal to 1 as a constant, and that
# build (the key loops folded away) gave NaN / wrong rows at one key (H100, Triton 3.6; the
# design note); the general build is right there
@gluon.jit(do_not_specialize=["S_kv"])
def _attention_8bit_ws_kernel(
    q_desc,
    k_desc,
    vt_desc,  # TMA: Q, K (B, S, H, D) 8-bit; V^T (B*H*D, S_pad) e4m3
    qs_ptr,
    kb_ptr,
    vs_ptr,
    o_ptr,  # q scales (B, H, S_q); key tile scales (B*H, tiles);
    # V scales (B*H, D); output (B, S_q, H, D), channels
    # contiguous
    ones_ptr,  # e4m3 (8, BLOCK_N) of 1.0: the row sum's B operand
    count_ptr,  # int32: a key mask's kept keys of each batch entry (B,), compacted to the
    # front; a float pointer: every key
    amax_ptr,
    os_ptr,  # with an e4m3 output: V's amax a batch entry (B,) as int32 bits; the output's
    # scales (B, S_q), contiguous
    S_q,
    S_kv,
    H,
    n_m,
    c_scale,  # c_scale: softmax scale * log2(e)
    stride_qsb,
    stride_qsh,
    stride_qss,
    stride_ob,
    stride_os,
    stride_oh,
    D: gl.constexpr,
    BLOCK_N: gl.constexpr,
    STAGES: gl.constexpr,
    QK_INT: gl.constexpr,
    ROUND_F16: gl.constexpr = False,  # an e4m3 o_ptr: rows quantized from the 16-bit output
    # (the consumers' epilogue) rounded to fp16 (else bf16)
):
    # one flat grid, query tiles fastest: the programs of one (batch, head) run together
    # and share its K / V in L2 (and B * H is not bound by the 65,535 of grid axis 1)
    pid = gl.program_id(0)
    bh = pid // n_m
    start_m = (pid - bh * n_m) * BLOCK_M
    b = bh // H
    h = bh - b * H
    # the key tile scales' rows cover every key (a key mask's kept keys are fewer)
    kb_off = bh.to(gl.int64) * gl.cdiv(S_kv, BLOCK_N)
    keys = (S_kv, count_ptr, b)

    qk_dtype: gl.constexpr = q_desc.dtype
    # the 4-D TMA boxes (1, rows, 1, D); the consumers read them as 2-D tiles
    q_s = gl.allocate_shared_memory(qk_dtype, [2, 1, WG_M, 1, D], q_desc.layout)
    k_s = gl.allocate_shared_memory(qk_dtype, [STAGES, 1, BLOCK_N, 1, D], k_desc.layout)
    v_s = gl.allocate_shared_memory(
        gl.float8e4nv,
        [STAGES, D, BLOCK_N],
        gl.NVMMASharedLayout.get_default_for([D, BLOCK_N], gl.float8e4nv),
    )
    # the row sum's B operand: 8 rows of BLOCK_N ones, read K-major as V^T is. Loaded from
    # memory: a tile of ones built in registers (a constant or a splat) and stored here was
    # read back as other bytes by the wgmma (H100, Triton 3.6; the design note)
    ONES_L: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [4, 1], [1, 0])
    r1 = gl.arange(0, 8, layout=gl.SliceLayout(1, ONES_L))
    c1 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, ONES_L))
    ones_s = gl.allocate_shared_memory(
        gl.float8e4nv,
        [8, BLOCK_N],
        gl.NVMMASharedLayout.get_default_for([8, BLOCK_N], gl.float8e4nv),
        gl.load(ones_ptr + r1[:, None] * BLOCK_N + c1[None, :]),
    )
    fence_async_shared()
    q_bar = _mbarriers([1])
    mbarrier.init(q_bar, count=1)
    # a stage's slot is empty once both consumer warpgroups have read it
    k_ready, v_ready, empty = _barrier_ring(STAGES, (1, 1, 2))

    qs_off = b.to(gl.int64) * stride_qsb + h.to(gl.int64) * stride_qsh
    vs_off = bh.to(gl.int64) * D
    o_off = b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh
    ring = (q_s, k_s, v_s, ones_s)
    bars = (q_bar, k_ready, v_ready, empty)
    cargs = (
        ring,
        bars,
        (qs_ptr, qs_off, stride_qss),
        (kb_ptr, kb_off),
        (vs_ptr, vs_off),
        (o_ptr, o_off, stride_os, ROUND_F16, (amax_ptr, os_ptr, b, h)),
        (S_q, keys, start_m, c_scale),
    )
    descs = (q_desc, k_desc, vt_desc)
    gl.warp_specialize(
        [
            (_consumer_0, (cargs,)),
            (_consumer_1, (cargs,)),
            (_producer, (descs, ring, bars, b, h, start_m, bh * D, keys)),
        ],
        [4, 1],
        [240, 24],
    )
