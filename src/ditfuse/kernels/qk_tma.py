"""The persistent, TMA-fed variant of the QK-norm + RoPE kernel (private; the launcher is
in qk_norm_rope.py, which picks it where it applies).

Why: the per-token kernel (``_qk_kernel``) holds a token's Q and K in registers, so the
bytes a SM has in flight are bounded by the programs its registers allow (four at Wan's 40
heads), and every program pays one full memory latency before its first store. Here a
fixed grid of programs walks the work items (token, head group) and the Q/K tiles arrive
through the Tensor Memory Accelerator into shared memory, software-pipelined by Triton
(``num_stages``): while one token is normalised, rotated and stored, the next ones are
already on their way, and the buffers live in shared memory, not registers.

The arithmetic after the load is the per-token kernel's own (``_norm_rope_tensor``: the
same statistics, norm, rounding, rotation and stores), fed with the same (a, b) pair tiles:
the TMA tile [heads, D] is split in registers into the a and b channel of every rotary
pair (interleaved: (2i, 2i+1); rotate-half: (i, i + D/2)).

The norm weights / biases are loaded once per program (a norm across heads takes all heads
in one item, so they never change); each token's cos/sin row comes by TMA too.

Applies to: rotary over the whole head (rotary_dim == D), D a power of two, tables shared
by the heads, no position gather, no head-parallel statistics, every Q/K operand with unit
channel stride, 16-byte aligned base and strides (the TMA's rules). The launcher checks.
"""
from __future__ import annotations

import triton.language as tl

from ditfuse.kernels.qk_token import _load_pairs, _local_heads, _norm_affine, _norm_stats, _store_pairs
from ditfuse.kernels.element import _rnd
from ditfuse.runtime.backend import INTERPRET, jit

_INTERP_LOOP = tl.constexpr(INTERPRET)


@jit
def _tma_piece(desc, b, s, h, NH: tl.constexpr, D: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Heads ``h .. h + NH`` of token (b, s) as fp32 (a, b) pair tiles [NH, D / 2] (heads
    past H arrive as zeros: the TMA fills out-of-bounds boxes)."""
    x = desc.load([b, s, h, 0]).reshape(NH, D).to(tl.float32)
    if INTERLEAVED:
        xa, xb = tl.split(tl.reshape(x, (NH, D // 2, 2)))
    else:
        xa, xb = tl.split(tl.permute(tl.reshape(x, (NH, 2, D // 2)), (0, 2, 1)))
    return xa, xb


@jit
def _split_row(row, D: tl.constexpr, INTERLEAVED: tl.constexpr, HALF: tl.constexpr):
    """A table row (W = D, or D / 2 when HALF) as the [1, D / 2] values of the a and b
    channel of every pair (``_load_pairs``'s meaning, with DUP = HALF)."""
    if HALF:
        r = tl.reshape(row, (1, D // 2))
        return r, r
    elif INTERLEAVED:
        return tl.split(tl.reshape(row, (1, D // 2, 2)))
    else:
        return tl.split(tl.permute(tl.reshape(row, (1, 2, D // 2)), (0, 2, 1)))


@jit
def _affine_pairs(w_ptr, b_ptr, hmask, NH: tl.constexpr, D: tl.constexpr,
                  HAS_W: tl.constexpr, HAS_B: tl.constexpr, SPAN_ALL: tl.constexpr,
                  H0: tl.constexpr, INTERLEAVED: tl.constexpr):
    """Norm weight / bias as (a, b) pair tiles, loaded once per program: [NH, D / 2] for a
    norm across heads (channel h * D + d, heads H0 ..), [1, D / 2] for a per-head one."""
    wa = 1.0
    wb = 1.0
    ba = 0.0
    bb = 0.0
    if SPAN_ALL:
        hh = H0 + tl.arange(0, NH)[:, None]
        if HAS_W:
            wa, wb = _load_pairs(w_ptr, 0, hh, hmask, D, 1, NH, D // 2, D // 2, INTERLEAVED,
                                 False)
        if HAS_B:
            ba, bb = _load_pairs(b_ptr, 0, hh, hmask, D, 1, NH, D // 2, D // 2, INTERLEAVED,
                                 False)
    else:
        z = tl.zeros([1, 1], tl.int32)
        if HAS_W:
            wa, wb = _load_pairs(w_ptr, 0, z, z == 0, 0, 1, 1, D // 2, D // 2, INTERLEAVED,
                                 False)
        if HAS_B:
            ba, bb = _load_pairs(b_ptr, 0, z, z == 0, 0, 1, 1, D // 2, D // 2, INTERLEAVED,
                                 False)
    return wa, wb, ba, bb


@jit
def _finish_tma_piece(o_ptr, obase, hh, hmask, stride_oh, stride_od, xa, xb,
                      mean, rstd, alpha, wa, wb, ba, bb, ca, cb, sa, sb,
                      D: tl.constexpr, NH: tl.constexpr, NORM: tl.constexpr,
                      HAS_W: tl.constexpr, HAS_B: tl.constexpr, ROUND_PRE_W: tl.constexpr,
                      ROUND_NORM: tl.constexpr, INTERLEAVED: tl.constexpr, ACT: tl.constexpr):
    """``_finish_piece``'s arithmetic with every operand already in registers."""
    ya = _norm_affine(xa, wa, ba, mean, rstd, alpha, NORM, HAS_W, HAS_B, ROUND_PRE_W, ACT)
    yb = _norm_affine(xb, wb, bb, mean, rstd, alpha, NORM, HAS_W, HAS_B, ROUND_PRE_W, ACT)
    if ROUND_NORM:
        ya = _rnd(ya, ACT)
        yb = _rnd(yb, ACT)
    oa = ya * ca - yb * sa
    ob = yb * cb + ya * sb
    _store_pairs(o_ptr, obase, hh, hmask, stride_oh, stride_od, oa, ob, NH, D // 2, D // 2,
                 INTERLEAVED)


@jit
def _tma_tensor(desc0, desc1, bi, si, hs, o_ptr, obase, stride_oh, stride_od, h_start, h_end,
                alpha_ptr, alpha_val, eps, n_norm, tok,
                wa0, wb0, ba0, bb0, wa1, wb1, ba1, bb1, ca, cb, sa, sb,
                D: tl.constexpr, P0: tl.constexpr, P1: tl.constexpr,
                NORM: tl.constexpr, SPAN_ALL: tl.constexpr, HAS_W: tl.constexpr,
                HAS_B: tl.constexpr, ALPHA_FROM_PTR: tl.constexpr, ROUND_PRE_W: tl.constexpr,
                ROUND_NORM: tl.constexpr, INTERLEAVED: tl.constexpr, OFF64: tl.constexpr):
    """Load (TMA), normalise, rotate and store one tensor's heads of one work item."""
    ACT: tl.constexpr = o_ptr.dtype.element_ty
    xa0, xb0 = _tma_piece(desc0, bi, si, hs, P0, D, INTERLEAVED)
    hh0, hm0 = _local_heads(h_start, h_end, 0, P0, OFF64)
    ma0 = hm0 & (tl.arange(0, D // 2)[None, :] < D // 2)
    zp0 = tl.zeros([P0, 1], tl.float32)  # no pass-through channels
    xa1 = 0.0
    xb1 = 0.0
    zp1 = 0.0
    ma1 = ma0
    if P1 > 0:
        xa1, xb1 = _tma_piece(desc1, bi, si, hs + P0, P1, D, INTERLEAVED)
        hh1, hm1 = _local_heads(h_start, h_end, P0, P1, OFF64)
        ma1 = hm1 & (tl.arange(0, D // 2)[None, :] < D // 2)
        zp1 = tl.zeros([P1, 1], tl.float32)
    # pass-through masks all false: a LayerNorm's centring must not count those lanes
    mp0 = zp0 != 0.0
    mp1 = mp0
    if P1 > 0:
        mp1 = zp1 != 0.0
    mean0, rstd0, mean1, rstd1, alpha = _norm_stats(
        xa0, xb0, zp0, xa1, xb1, zp1, ma0, mp0, ma1, mp1, alpha_ptr, alpha_val, eps,
        o_ptr, tok, n_norm, P1, NORM, SPAN_ALL, ALPHA_FROM_PTR, 0)
    obase = obase + h_start * stride_oh
    _finish_tma_piece(o_ptr, obase, hh0, hm0, stride_oh, stride_od, xa0, xb0, mean0, rstd0,
                      alpha, wa0, wb0, ba0, bb0, ca, cb, sa, sb, D, P0, NORM, HAS_W, HAS_B,
                      ROUND_PRE_W, ROUND_NORM, INTERLEAVED, ACT)
    if P1 > 0:
        _finish_tma_piece(o_ptr, obase, hh1, hm1, stride_oh, stride_od, xa1, xb1, mean1,
                          rstd1, alpha, wa1, wb1, ba1, bb1, ca, cb, sa, sb, D, P1, NORM, HAS_W,
                          HAS_B, ROUND_PRE_W, ROUND_NORM, INTERLEAVED, ACT)


@jit
def _qk_norm_rope_tma_kernel(
    q_desc0, q_desc1,         # Q (B, S, H, D) TMA descriptors, boxes of P0 / P1 heads
    k_desc0, k_desc1,         # K likewise (unused when HAS_K is false)
    c_desc, s_desc,           # cos / sin (Bt, S, W) TMA descriptors, one row a box
    qo_ptr, ko_ptr,           # Q / K out (may be the input memory: in place)
    qw_ptr, qb_ptr, qa_ptr,   # Q norm weight, bias, DyT alpha
    kw_ptr, kb_ptr, ka_ptr,   # K norm weight, bias, DyT alpha
    q_alpha, k_alpha,         # DyT alpha when given as a Python float
    q_eps, k_eps,
    q_n, k_n,                 # channels one norm statistic spans (D or H*D), as float
    n_items, n_hg,            # work items (tokens x head groups), head groups per token
    S, H,
    TABLE_BATCH,              # 1 when the tables hold one row per token for every batch entry
    stride_qob, stride_qos, stride_qoh, stride_qod,
    stride_kob, stride_kos, stride_koh, stride_kod,
    D: tl.constexpr,          # head_dim = rotary width, a power of two
    HG: tl.constexpr,         # heads per work item
    P0: tl.constexpr, P1: tl.constexpr,  # HG as two power-of-two pieces (P1 may be 0)
    Q_NORM: tl.constexpr, Q_SPAN_ALL: tl.constexpr, Q_HAS_W: tl.constexpr,
    Q_HAS_B: tl.constexpr, Q_ALPHA_PTR: tl.constexpr, Q_ROUND_PRE_W: tl.constexpr,
    K_NORM: tl.constexpr, K_SPAN_ALL: tl.constexpr, K_HAS_W: tl.constexpr,
    K_HAS_B: tl.constexpr, K_ALPHA_PTR: tl.constexpr, K_ROUND_PRE_W: tl.constexpr,
    HAS_K: tl.constexpr,
    INTERLEAVED: tl.constexpr,  # pairs (2i, 2i+1) rather than (i, i + D/2)
    TABLE_HALF: tl.constexpr,   # table width D/2 (unique frequencies) rather than D
    ROUND_NORM: tl.constexpr,
    OFF64: tl.constexpr,        # offsets within a token need 64 bits
    STAGES: tl.constexpr,       # work items in flight per program (TMA buffers)
):
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    # norm weights and biases: the same for every item (a norm across heads takes every
    # head in one item), loaded once
    qh0 = tl.arange(0, P0)[:, None] < H
    qwa0, qwb0, qba0, qbb0 = _affine_pairs(qw_ptr, qb_ptr, qh0, P0, D, Q_HAS_W, Q_HAS_B,
                                           Q_SPAN_ALL, 0, INTERLEAVED)
    qwa1, qwb1, qba1, qbb1 = qwa0, qwb0, qba0, qbb0
    kwa0, kwb0, kba0, kbb0 = qwa0, qwb0, qba0, qbb0
    kwa1, kwb1, kba1, kbb1 = qwa0, qwb0, qba0, qbb0
    if P1 > 0:
        qh1 = P0 + tl.arange(0, P1)[:, None] < H
        qwa1, qwb1, qba1, qbb1 = _affine_pairs(qw_ptr, qb_ptr, qh1, P1, D, Q_HAS_W, Q_HAS_B,
                                               Q_SPAN_ALL, P0, INTERLEAVED)
    if HAS_K:
        kwa0, kwb0, kba0, kbb0 = _affine_pairs(kw_ptr, kb_ptr, qh0, P0, D, K_HAS_W, K_HAS_B,
                                               K_SPAN_ALL, 0, INTERLEAVED)
        if P1 > 0:
            kwa1, kwb1, kba1, kbb1 = _affine_pairs(kw_ptr, kb_ptr, qh1, P1, D, K_HAS_W,
                                                   K_HAS_B, K_SPAN_ALL, P0, INTERLEAVED)
    if _INTERP_LOOP:
        # the interpreter cannot take tensor bounds in range() (numpy >= 2.3): the same
        # items in the same order
        w = pid
        while w < n_items:
            _tma_item(w, n_hg, S, H, TABLE_BATCH, q_desc0, q_desc1, qo_ptr, k_desc0, k_desc1,
                      ko_ptr, c_desc, s_desc, qa_ptr, ka_ptr, q_alpha, k_alpha, q_eps, k_eps,
                      q_n, k_n, stride_qob, stride_qos, stride_qoh, stride_qod,
                      stride_kob, stride_kos, stride_koh, stride_kod,
                      qwa0, qwb0, qba0, qbb0, qwa1, qwb1, qba1, qbb1,
                      kwa0, kwb0, kba0, kbb0, kwa1, kwb1, kba1, kbb1,
                      D, HG, P0, P1, Q_NORM, Q_SPAN_ALL, Q_HAS_W, Q_HAS_B, Q_ALPHA_PTR,
                      Q_ROUND_PRE_W, K_NORM, K_SPAN_ALL, K_HAS_W, K_HAS_B, K_ALPHA_PTR,
                      K_ROUND_PRE_W, HAS_K, INTERLEAVED, TABLE_HALF, ROUND_NORM, OFF64)
            w += G
    else:
        for w in tl.range(pid, n_items, G, num_stages=STAGES):
            _tma_item(w, n_hg, S, H, TABLE_BATCH, q_desc0, q_desc1, qo_ptr, k_desc0, k_desc1,
                      ko_ptr, c_desc, s_desc, qa_ptr, ka_ptr, q_alpha, k_alpha, q_eps, k_eps,
                      q_n, k_n, stride_qob, stride_qos, stride_qoh, stride_qod,
                      stride_kob, stride_kos, stride_koh, stride_kod,
                      qwa0, qwb0, qba0, qbb0, qwa1, qwb1, qba1, qbb1,
                      kwa0, kwb0, kba0, kbb0, kwa1, kwb1, kba1, kbb1,
                      D, HG, P0, P1, Q_NORM, Q_SPAN_ALL, Q_HAS_W, Q_HAS_B, Q_ALPHA_PTR,
                      Q_ROUND_PRE_W, K_NORM, K_SPAN_ALL, K_HAS_W, K_HAS_B, K_ALPHA_PTR,
                      K_ROUND_PRE_W, HAS_K, INTERLEAVED, TABLE_HALF, ROUND_NORM, OFF64)


@jit
def _tma_item(w, n_hg, S, H, TABLE_BATCH, q_desc0, q_desc1, qo_ptr, k_desc0, k_desc1, ko_ptr,
              c_desc, s_desc, qa_ptr, ka_ptr, q_alpha, k_alpha, q_eps, k_eps, q_n, k_n,
              stride_qob, stride_qos, stride_qoh, stride_qod,
              stride_kob, stride_kos, stride_koh, stride_kod,
              qwa0, qwb0, qba0, qbb0, qwa1, qwb1, qba1, qbb1,
              kwa0, kwb0, kba0, kbb0, kwa1, kwb1, kba1, kbb1,
              D: tl.constexpr, HG: tl.constexpr, P0: tl.constexpr, P1: tl.constexpr,
              Q_NORM: tl.constexpr, Q_SPAN_ALL: tl.constexpr, Q_HAS_W: tl.constexpr,
              Q_HAS_B: tl.constexpr, Q_ALPHA_PTR: tl.constexpr, Q_ROUND_PRE_W: tl.constexpr,
              K_NORM: tl.constexpr, K_SPAN_ALL: tl.constexpr, K_HAS_W: tl.constexpr,
              K_HAS_B: tl.constexpr, K_ALPHA_PTR: tl.constexpr, K_ROUND_PRE_W: tl.constexpr,
              HAS_K: tl.constexpr, INTERLEAVED: tl.constexpr, TABLE_HALF: tl.constexpr,
              ROUND_NORM: tl.constexpr, OFF64: tl.constexpr):
    """One work item: heads ``(w % n_hg) * HG ..`` of token ``w // n_hg``, Q then K."""
    tq = w // n_hg
    tok = tq.to(tl.int64)
    h_start = (w - tq * n_hg).to(tl.int64) * HG
    h_end = tl.minimum(h_start + HG, H)
    b = tok // S
    s = tok - b * S
    bi = b.to(tl.int32)
    si = s.to(tl.int32)
    hs = h_start.to(tl.int32)
    W: tl.constexpr = D // 2 if TABLE_HALF else D
    crow = c_desc.load([bi * TABLE_BATCH, si, 0]).reshape(W).to(tl.float32)
    srow = s_desc.load([bi * TABLE_BATCH, si, 0]).reshape(W).to(tl.float32)
    ca, cb = _split_row(crow, D, INTERLEAVED, TABLE_HALF)
    sa, sb = _split_row(srow, D, INTERLEAVED, TABLE_HALF)
    _tma_tensor(q_desc0, q_desc1, bi, si, hs, qo_ptr, b * stride_qob + s * stride_qos,
                stride_qoh, stride_qod, h_start, h_end, qa_ptr, q_alpha, q_eps, q_n, tok,
                qwa0, qwb0, qba0, qbb0, qwa1, qwb1, qba1, qbb1, ca, cb, sa, sb,
                D, P0, P1, Q_NORM, Q_SPAN_ALL, Q_HAS_W, Q_HAS_B, Q_ALPHA_PTR, Q_ROUND_PRE_W,
                ROUND_NORM, INTERLEAVED, OFF64)
    if HAS_K:
        _tma_tensor(k_desc0, k_desc1, bi, si, hs, ko_ptr, b * stride_kob + s * stride_kos,
                    stride_koh, stride_kod, h_start, h_end, ka_ptr, k_alpha, k_eps, k_n, tok,
                    kwa0, kwb0, kba0, kbb0, kwa1, kwb1, kba1, kbb1, ca, cb, sa, sb,
                    D, P0, P1, K_NORM, K_SPAN_ALL, K_HAS_W, K_HAS_B, K_ALPHA_PTR,
                    K_ROUND_PRE_W, ROUND_NORM, INTERLEAVED, OFF64)
