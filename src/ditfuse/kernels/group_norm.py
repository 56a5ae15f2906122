"""GroupNorm (+ SiLU) kernels: one-read fit path, split statistics / apply path,
channels-last tiles, and Wan VAE's RMS norm over channels (+ SiLU).

Launched by :mod:`ditfuse.ops.group_norm` (launch table, checks, public functions); design
and measurements: docs/design/group_norm.md."""

from __future__ import annotations

from typing import NamedTuple

import triton.language as tl

from ditfuse.kernels.element import _PTX, _cast_out, _ex2, _rnd
from ditfuse.runtime.backend import jit


@jit
def _silu(y):
    """SiLU in fp32: y / (1 + exp(-y)), exp as exp2(-y log2 e).

    On the GPU the exp2 and the quotient are ``ex2.approx.ftz`` and ``div.approx.ftz``: the
    values of the ``ex2.approx`` / ``div.full`` that ``tl.exp`` and ``/`` give, without
    their range handling (3 instructions an element each, where the apply pass is bound by
    instruction issue). They differ only where exp(-y) < 2^-126 (y > 87: 1 + exp(-y) is 1
    either way) or 1 + exp(-y) > 2^126 (y < -87: the quotient is -0 instead of |y| e^y
    < 1e-36, far below every dtype's contract tolerance).
    """
    e = _ex2(y * -1.4426950408889634)
    if _PTX:  # the GPU: one div.approx.ftz (see the docstring)
        return tl.inline_asm_elementwise(
            "div.approx.ftz.f32 $0, $1, $2;",
            "=r,r,r",
            [y, 1.0 + e],
            dtype=tl.float32,
            is_pure=True,
            pack=1,
        )
    else:
        return y / (1.0 + e)


class FinishFlags(NamedTuple):
    """The steps after the normalization that a kernel compiles (``FIN``: ``_gn_finish`` /
    ``_rms_finish``)."""

    has_w: bool  # a per-channel weight (gamma)
    has_b: bool  # a per-channel bias
    silu: bool
    round_norm: bool  # rounded to the activation dtype where the eager chain rounds


@jit
def _gn_finish(y_ptr, yoff, m, y, b, FIN: tl.constexpr, ACT: tl.constexpr):
    """+ bias (the weight is folded into rstd by the callers), [round], SiLU, one rounding
    at the store."""
    if FIN.has_b:
        y = y + b
    if FIN.round_norm:  # where torch's eager GroupNorm -> SiLU chain rounds
        y = _rnd(y, ACT)
    if FIN.silu:
        y = _silu(y)
    # y is not read again here: a streaming store leaves L2 to the x the apply pass re-reads
    tl.store(y_ptr + yoff, _cast_out(y, y_ptr.dtype.element_ty), mask=m, cache_modifier=".cs")


@jit
def _load_f32(ptrs, m, EVEN: tl.constexpr, EVICT: tl.constexpr):
    """The values at ``ptrs`` as fp32: unmasked when ``EVEN`` (whole tiles), else 0 where
    ``m`` is false. ``EVICT``: the L2 eviction policy ("", "evict_first", "evict_last")."""
    if EVEN:
        return tl.load(ptrs, eviction_policy=EVICT).to(tl.float32)
    else:
        return tl.load(ptrs, mask=m, other=0.0, eviction_policy=EVICT).to(tl.float32)


@jit
def _load_channels(p, c, stride, cm, HAS: tl.constexpr, EVEN: tl.constexpr, ABSENT: tl.constexpr):
    """A per-channel parameter for channel rows ``c``, as fp32 (``ABSENT`` without one)."""
    if not HAS:
        return ABSENT
    else:
        return _load_f32(p + c * stride, cm, EVEN, "")


@jit
def _gn_fit_kernel(
    x_ptr,
    y_ptr,  # input / output, addressed as (N, C, S)
    w_ptr,
    b_ptr,  # per-channel weight / bias, any float dtype (dummies if absent)
    G,
    cpg,
    S,  # groups, channels per group, spatial positions
    count,  # cpg * S as a float
    eps,
    x_strides,  # x's and y's (n, c, s) element strides, tuples
    y_strides,
    wb_strides,  # weight's and bias's element strides along their channel axis
    BC: tl.constexpr,  # >= cpg (power of two)
    BS: tl.constexpr,  # >= S (power of two)
    FIN: tl.constexpr,  # FinishFlags
):
    """One program per (n, group): the whole group is loaded once into registers."""
    ACT: tl.constexpr = x_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    n = pid // G
    g = pid - n * G
    c = tl.arange(0, BC)[:, None].to(tl.int64)
    s = tl.arange(0, BS)[None, :].to(tl.int64)
    m = (c < cpg) & (s < S)
    ch = g * cpg + c
    x = tl.load(
        x_ptr + n * x_strides[0] + ch * x_strides[1] + s * x_strides[2], mask=m, other=0.0
    ).to(tl.float32)
    # two passes over registers: the mean, then deviations from it; the deviations' own
    # sum corrects the mean (Chan, Golub & LeVeque's corrected two-pass algorithm)
    m1 = tl.sum(x) / count
    d = tl.where(m, x - m1, 0.0)
    s1 = tl.sum(d)
    s2 = tl.sum(d * d)
    corr = s1 / count
    var = tl.maximum(s2 - s1 * corr, 0.0) / count
    rstd = 1.0 / tl.sqrt_rn(var + eps)
    cm = c < cpg
    w = _load_channels(w_ptr, ch, wb_strides[0], cm, FIN.has_w, False, 1.0)
    b = _load_channels(b_ptr, ch, wb_strides[1], cm, FIN.has_b, False, 0.0)
    y = (d - corr) * (rstd * w)
    _gn_finish(y_ptr, n * y_strides[0] + ch * y_strides[1] + s * y_strides[2], m, y, b, FIN, ACT)


@jit
def _tile_moments(x, msk, nb, EVEN: tl.constexpr = False):
    """(mean, M2) of the ``nb`` unmasked values of tile ``x`` (masked lanes hold 0): the
    corrected two-pass reduction over registers. ``EVEN``: no lane is masked."""
    nb1 = tl.maximum(nb, 1.0)
    mb = tl.sum(x) / nb1
    if EVEN:
        d = x - mb
    else:
        d = tl.where(msk, x - mb, 0.0)
    s1 = tl.sum(d)
    s2 = tl.sum(d * d)
    return mb + s1 / nb1, s2 - s1 * (s1 / nb1)


@jit
def _tile_offsets(ci, si, stride_c, stride_s, OFF64: tl.constexpr):
    """Element offsets inside a tile from its corner: int32 unless ``OFF64``."""
    if OFF64:
        return ci.to(tl.int64) * stride_c + si.to(tl.int64) * stride_s
    else:
        return ci * stride_c + si * stride_s


@jit
def _gn_stats_kernel(
    x_ptr,  # input, addressed as (N, C, S)
    part_ptr,  # fp32 partials [4, N*G*P]: count, mean, M2 (of x - K), K
    G,
    cpg,
    S,
    n_ts,  # spatial tiles per channel block: cdiv(S, BS)
    T,  # tiles per group: cdiv(cpg, BC) * n_ts
    P,  # statistics programs per group
    NGP,  # N * G * P (row length of the partials)
    x_strides,  # x's (n, c, s) element strides, a tuple
    BC: tl.constexpr,
    BS: tl.constexpr,  # one tile: BC channels x BS positions
    TPP: tl.constexpr,  # tiles per program
    OFF64: tl.constexpr,  # offsets inside a tile need int64
    EVEN: tl.constexpr,  # BC | cpg, BS | S and P * TPP == T: no masks
):
    """Partial (count, mean, M2) of TPP consecutive tiles of one group.

    Each tile's statistics come from a corrected two-pass reduction over registers; tiles
    are merged with Chan's parallel formula (no E[x^2] - E[x]^2 anywhere). The data are
    shifted by the group's first element K (read by every program of the group, from
    cache), so that the partial means stay of the order of the spread, not of the offset:
    their fp32 rounding then costs nothing however large the offset.
    """
    pid = tl.program_id(0).to(tl.int64)
    ng = pid // P
    k = pid - ng * P
    n = ng // G
    g = ng - n * G
    base = n * x_strides[0] + g * cpg * x_strides[1]
    K = tl.load(x_ptr + base).to(tl.float32)
    ci = tl.arange(0, BC)[:, None]
    si = tl.arange(0, BS)[None, :]
    inner = _tile_offsets(ci, si, x_strides[1], x_strides[2], OFF64)
    cnt = tl.zeros((), tl.float32)
    mean = tl.zeros((), tl.float32)
    m2 = tl.zeros((), tl.float32)
    for i in range(TPP):
        t = k * TPP + i
        tc = t // n_ts
        ts = t - tc * n_ts
        # the tile's corner in int64, offsets inside it in int32 (unless OFF64), bounds as
        # int32 scalars clamped to the tile first (S may pass 2^31): no 64-bit arithmetic
        # per element (the passes are issue-bound)
        corner = base + (tc * BC) * x_strides[1] + (ts * BS) * x_strides[2]
        # evict_last: the apply pass reads x again; what of it is still in L2 when the
        # statistics end should stay there over the apply pass's first (DRAM) tiles
        if EVEN:  # every tile whole, every program's tiles inside the group: no masks
            msk = None
            x = _load_f32(x_ptr + corner + inner, msk, EVEN, "evict_last") - K
            nb = tl.full((), BC * BS, tl.float32)
        else:
            msk = (
                (ci < (cpg - tc * BC).to(tl.int32))
                & (si < tl.minimum(S - ts * BS, BS).to(tl.int32))
                & (t < T)
            )
            x = _load_f32(x_ptr + corner + inner, msk, EVEN, "evict_last")
            x = tl.where(msk, x - K, 0.0)
            nb = tl.where(t < T, tl.minimum(cpg - tc * BC, BC) * tl.minimum(S - ts * BS, BS), 0).to(
                tl.float32
            )
        mb, m2b = _tile_moments(x, msk, nb, EVEN)
        tot = cnt + nb
        frac = nb / tl.maximum(tot, 1.0)
        delta = mb - mean
        mean = mean + delta * frac
        m2 = m2 + m2b + delta * delta * (cnt * frac)
        cnt = tot
    idx = ng * P + k
    tl.store(part_ptr + idx, cnt)
    tl.store(part_ptr + NGP + idx, mean)
    tl.store(part_ptr + 2 * NGP + idx, m2)
    tl.store(part_ptr + 3 * NGP + idx, K)  # for the apply pass: x may be overwritten (in place)


@jit
def _merge_partials(part_ptr, ng, P, NGP, eps, P_PAD: tl.constexpr):
    """(mean_hi, corr, rstd, K) of group ``ng`` from its ``P`` partials (count, mean, M2 of
    x - K; K the group's first element): Chan's parallel merge, the mean kept as two floats
    (mean_hi + corr) so that nothing of the spread is lost to the offset."""
    kk = tl.arange(0, P_PAD).to(tl.int64)
    pm = kk < P
    pidx = ng * P + kk
    pc = tl.load(part_ptr + pidx, mask=pm, other=0.0)
    pmu = tl.load(part_ptr + NGP + pidx, mask=pm, other=0.0)
    pm2 = tl.load(part_ptr + 2 * NGP + pidx, mask=pm, other=0.0)
    count = tl.sum(pc)
    mhi = tl.sum(pc * pmu) / count
    dm = tl.where(pm, pmu - mhi, 0.0)
    s1 = tl.sum(pc * dm)
    corr = s1 / count  # the mean is mhi + corr, kept as two floats
    m2 = tl.sum(pm2) + tl.sum(pc * dm * dm) - s1 * corr
    var = tl.maximum(m2, 0.0) / count
    rstd = 1.0 / tl.sqrt_rn(var + eps)
    K = tl.load(part_ptr + 3 * NGP + ng * P)
    return mhi, corr, rstd, K


@jit
def _gn_apply_kernel(
    x_ptr,
    y_ptr,
    w_ptr,
    b_ptr,
    part_ptr,  # partials written by _gn_stats_kernel
    G,
    cpg,
    S,
    n_ts,
    T,
    P,
    NGP,
    eps,
    x_strides,
    y_strides,
    wb_strides,  # as in _gn_fit_kernel
    BC: tl.constexpr,
    BS: tl.constexpr,
    P_PAD: tl.constexpr,  # >= P (power of two)
    OFF64: tl.constexpr,  # offsets inside a tile (x's or y's) need int64
    EVEN: tl.constexpr,  # BC | cpg and BS | S: no masks
    FIN: tl.constexpr,
):
    """One tile per program: merge the group's P partials (statistics of x - K, K the
    group's first element), then normalise the tile."""
    ACT: tl.constexpr = x_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    ng = pid // T
    t = pid - ng * T
    n = ng // G
    g = ng - n * G
    mhi, corr, rstd, K = _merge_partials(part_ptr, ng, P, NGP, eps, P_PAD)

    tc = t // n_ts
    ts = t - tc * n_ts
    ci = tl.arange(0, BC)[:, None]
    si = tl.arange(0, BS)[None, :]
    if EVEN:  # BC | cpg and BS | S: whole tiles, no masks
        cm = None
        m = None
    else:
        cm = ci < (cpg - tc * BC).to(tl.int32)
        m = cm & (si < tl.minimum(S - ts * BS, BS).to(tl.int32))
    c0 = g * cpg + tc * BC  # the tile's first channel and position, int64 scalars
    s0 = ts * BS
    x_ptrs = (
        x_ptr
        + (n * x_strides[0] + c0 * x_strides[1] + s0 * x_strides[2])
        + _tile_offsets(ci, si, x_strides[1], x_strides[2], OFF64)
    )
    x = _load_f32(x_ptrs, m, EVEN, "evict_first")  # x's last read: leave L2 to unread tiles
    w = _load_channels(w_ptr + c0 * wb_strides[0], ci, wb_strides[0], cm, FIN.has_w, EVEN, 1.0)
    b = _load_channels(b_ptr + c0 * wb_strides[1], ci, wb_strides[1], cm, FIN.has_b, EVEN, 0.0)
    # rstd * w once per channel row, not per element (the kernel is issue-bound)
    y = (((x - K) - mhi) - corr) * (rstd * w)
    y0p = y_ptr + (n * y_strides[0] + c0 * y_strides[1] + s0 * y_strides[2])
    _gn_finish(y0p, _tile_offsets(ci, si, y_strides[1], y_strides[2], OFF64), m, y, b, FIN, ACT)


# Channels-last input (x's channel stride 1): a position's channels are one contiguous row,
# a group a run of C/G of them. The kernels above tile one group (rows of C/G channels, 8-32
# bytes at the VAEs' 128-512 channels: a sector read for a quarter of its bytes at 4 channels
# a group); these tile GB groups side by side (L = GB * CPP channel lanes, whole 128-byte rows
# in bf16 at 64 lanes, ``GNTable.cl_lanes``) x BS positions, and keep per-group sums as [GB]
# vectors.


@jit
def _group_sum(v, GB: tl.constexpr, CPP: tl.constexpr):
    """[GB * CPP] lane values -> [GB] group sums (lanes of a group are adjacent)."""
    return tl.sum(tl.reshape(v, (GB, CPP)), 1)


@jit
def _to_lanes(v, GB: tl.constexpr, CPP: tl.constexpr):
    """[GB] group values -> [GB * CPP] lane values."""
    return tl.reshape(tl.broadcast_to(v[:, None], (GB, CPP)), (GB * CPP,))


@jit
def _cl_lanes(G, cpg, gb, GB: tl.constexpr, CPP: tl.constexpr, POW2: tl.constexpr):
    """Per lane of group block ``gb``: (group within the block, channel offset from the
    block's first channel, lane valid). ``POW2``: cpg == CPP, the lanes are the channels."""
    lane = tl.arange(0, GB * CPP)
    gl = lane // CPP
    if POW2:
        ch = lane
        ok = (gb * GB + gl) < G
    else:
        cl = lane - gl * CPP
        ch = gl * cpg + cl
        ok = (cl < cpg) & ((gb * GB + gl) < G)
    return gl, ch, ok


@jit
def _gn_cl_stats_kernel(
    x_ptr,  # input, addressed as (N, C, S) with channel stride 1
    part_ptr,  # fp32 partials [4, N*G*P]: count, mean, M2 (of x - K), K
    G,
    cpg,
    S,
    n_gb,  # group blocks: cdiv(G, GB)
    n_ts,  # position tiles: cdiv(S, BS)
    P,  # statistics programs per group (each TPP position tiles)
    NGP,  # N * G * P
    x_strides,  # x's (n, c, s) element strides (c: 1), a tuple
    GB: tl.constexpr,  # groups a tile spans
    CPP: tl.constexpr,  # lanes a group takes: next_pow2(cpg)
    BS: tl.constexpr,  # positions a tile
    TPP: tl.constexpr,  # tiles per program
    POW2: tl.constexpr,  # cpg == CPP
    OFF64: tl.constexpr,  # offsets inside a tile need int64
    EVEN: tl.constexpr,  # POW2, GB | G, BS | S and P * TPP == n_ts: no masks
):
    """Partial (count, mean, M2) of GB groups over TPP consecutive position tiles.

    Each element slot of the tile (a lane at a row) keeps Welford's running mean and M2 of
    the values it sees, one a tile, in registers: no cross-thread work inside the loop.
    Once at the end, the slots of each group are merged by Chan's formula (the corrected
    two-pass over the slots' means). The data are shifted by each group's first element K,
    as in ``_gn_stats_kernel``; no E[x^2] - E[x]^2 anywhere.
    """
    pid = tl.program_id(0).to(tl.int64)
    nk = pid // n_gb  # the group block varies fastest: neighbours share rows
    gb = pid - nk * n_gb
    n = nk // P
    k = nk - n * P
    gl, ch, ok = _cl_lanes(G, cpg, gb, GB, CPP, POW2)
    base = n * x_strides[0] + gb * GB * cpg
    # each lane's group's first element (gathered: a lane per group reads memory)
    Kl = tl.load(x_ptr + base + gl * cpg, mask=ok, other=0.0).to(tl.float32)
    si = tl.arange(0, BS)[:, None]
    inner = _tile_offsets(ch[None, :], si, 1, x_strides[2], OFF64)
    mean = tl.zeros((BS, GB * CPP), tl.float32)
    m2 = tl.zeros((BS, GB * CPP), tl.float32)
    if EVEN:
        cnt = TPP * 1.0
    else:
        cnt = tl.zeros((BS, GB * CPP), tl.float32)
    for i in range(TPP):
        t = k * TPP + i
        corner = base + (t * BS) * x_strides[2]
        # a slot valid at tile i was valid at every earlier tile (the valid rows of a
        # tile only shrink along the positions): its count is i + 1
        inv = tl.div_rn(1.0, (i + 1) * 1.0)
        if EVEN:
            x = _load_f32(x_ptr + corner + inner, None, EVEN, "evict_last") - Kl[None, :]
            d = x - mean
            mean = mean + d * inv
            m2 = m2 + d * (x - mean)
        else:
            vp = tl.minimum(tl.maximum(S - t * BS, 0), BS).to(tl.int32)
            msk = (si < vp) & ok[None, :]
            x = _load_f32(x_ptr + corner + inner, msk, EVEN, "evict_last") - Kl[None, :]
            d = x - mean
            mn = mean + d * inv
            m2 = tl.where(msk, m2 + d * (x - mn), m2)
            mean = tl.where(msk, mn, mean)
            cnt = cnt + msk.to(tl.float32)
    # the slots of each group merged: count-weighted mean, then the corrected deviations
    if EVEN:
        ng = tl.full((GB,), TPP * BS * CPP, tl.float32)
        mu = _group_sum(tl.sum(mean, 0), GB, CPP) / ng
    else:
        ng = _group_sum(tl.sum(cnt, 0), GB, CPP)
        mu = _group_sum(tl.sum(cnt * mean, 0), GB, CPP) / tl.maximum(ng, 1.0)
    ng1 = tl.maximum(ng, 1.0)
    dev = mean - _to_lanes(mu, GB, CPP)[None, :]
    if not EVEN:
        dev = tl.where(cnt > 0, dev, 0.0)
    s1 = _group_sum(tl.sum(cnt * dev, 0), GB, CPP)
    sm2 = _group_sum(tl.sum(m2 + cnt * (dev * dev), 0), GB, CPP)
    gmean = mu + s1 / ng1
    gm2 = sm2 - s1 * (s1 / ng1)
    j = tl.arange(0, GB)
    gv = (gb * GB + j) < G
    Kg = tl.load(x_ptr + base + j * cpg, mask=gv, other=0.0).to(tl.float32)
    idx = (n * G + gb * GB + j) * P + k
    tl.store(part_ptr + idx, ng, mask=gv)
    tl.store(part_ptr + NGP + idx, gmean, mask=gv)
    tl.store(part_ptr + 2 * NGP + idx, gm2, mask=gv)
    tl.store(part_ptr + 3 * NGP + idx, Kg, mask=gv)


@jit
def _gn_merge_kernel(
    part_ptr,  # partials of _gn_cl_stats_kernel
    stat_ptr,  # fp32 [4, N*G]: mean_hi, corr, rstd, K of each group
    P,
    NGP,
    NG,
    eps,
    P_PAD: tl.constexpr,  # >= P (power of two)
):
    """One program a group: its partials merged once (the channels-last apply programs
    span many groups; each merging every group's partials would load GB x P of them)."""
    ng = tl.program_id(0).to(tl.int64)
    mhi, corr, rstd, K = _merge_partials(part_ptr, ng, P, NGP, eps, P_PAD)
    tl.store(stat_ptr + ng, mhi)
    tl.store(stat_ptr + NG + ng, corr)
    tl.store(stat_ptr + 2 * NG + ng, rstd)
    tl.store(stat_ptr + 3 * NG + ng, K)


@jit
def _gn_cl_apply_kernel(
    x_ptr,
    y_ptr,
    w_ptr,
    b_ptr,
    stat_ptr,  # written by _gn_merge_kernel
    G,
    cpg,
    S,
    n_gb,
    NG,
    x_strides,  # as in _gn_cl_stats_kernel
    y_strides,
    wb_strides,  # as in _gn_fit_kernel
    GB: tl.constexpr,
    CPP: tl.constexpr,
    BS: tl.constexpr,
    POW2: tl.constexpr,
    OFF64: tl.constexpr,  # offsets inside a tile (x's or y's) need int64
    EVEN: tl.constexpr,  # POW2, GB | G and BS | S: no masks
    FIN: tl.constexpr,
):
    """One tile of GB groups x BS positions a program, normalised with its groups' merged
    statistics (the arithmetic of ``_gn_apply_kernel``, per lane)."""
    ACT: tl.constexpr = x_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    nt = pid // n_gb
    gb = pid - nt * n_gb
    n_ts = tl.cdiv(S, BS)
    n = nt // n_ts
    ts = nt - n * n_ts
    gl, ch, ok = _cl_lanes(G, cpg, gb, GB, CPP, POW2)
    ng = n * G + gb * GB + gl
    si = tl.arange(0, BS)[:, None]
    if EVEN:
        cm = None
        m = None
    else:
        cm = ok
        m = ok[None, :] & (si < tl.minimum(S - ts * BS, BS).to(tl.int32))
    mhi = _load_f32(stat_ptr + ng, cm, EVEN, "")
    corr = _load_f32(stat_ptr + NG + ng, cm, EVEN, "")
    rstd = _load_f32(stat_ptr + 2 * NG + ng, cm, EVEN, "")
    K = _load_f32(stat_ptr + 3 * NG + ng, cm, EVEN, "")
    c0 = gb * GB * cpg
    s0 = ts * BS
    x = _load_f32(
        x_ptr
        + (n * x_strides[0] + c0 + s0 * x_strides[2])
        + _tile_offsets(ch[None, :], si, 1, x_strides[2], OFF64),
        m,
        EVEN,
        "evict_first",
    )
    w = _load_channels(w_ptr + c0 * wb_strides[0], ch, wb_strides[0], cm, FIN.has_w, EVEN, 1.0)
    b = _load_channels(b_ptr + c0 * wb_strides[1], ch, wb_strides[1], cm, FIN.has_b, EVEN, 0.0)
    y = (((x - K[None, :]) - mhi[None, :]) - corr[None, :]) * (rstd * w)[None, :]
    if FIN.has_b:
        b = b[None, :]
    y0p = y_ptr + (n * y_strides[0] + c0 * y_strides[1] + s0 * y_strides[2])
    yo = _tile_offsets(ch[None, :], si, y_strides[1], y_strides[2], OFF64)
    _gn_finish(y0p, yo, m, y, b, FIN, ACT)


@jit
def _rms_finish(x, inv, scale, affine, out, m, FIN: tl.constexpr, ACT: tl.constexpr):
    """``x * inv * scale`` [* gamma] [+ bias] [then SiLU], stored under mask ``m`` (None:
    none). ``affine``: the (gamma, bias) tiles; ``out``: (pointer, offsets)."""
    gm, b = affine
    y_ptr, yoff = out
    if FIN.round_norm:  # diffusers' WanRMS_norm in half precision: every op returns half
        y = _rnd(x * inv, ACT)
        y = _rnd(y * scale, ACT)
        if FIN.has_w:
            y = _rnd(y * gm, ACT)
        if FIN.has_b:
            y = _rnd(y + b, ACT)
    else:
        if FIN.has_w:
            y = (x * inv) * (gm * scale)
        else:
            y = (x * inv) * scale
        if FIN.has_b:
            y = y + b
    if FIN.silu:
        y = _silu(y)
    tl.store(y_ptr + yoff, _cast_out(y, y_ptr.dtype.element_ty), mask=m)


@jit
def _rms_ch_kernel(
    x_ptr,
    y_ptr,  # input / output, addressed as (N, C, S)
    g_ptr,
    b_ptr,  # per-channel gamma / bias (dummies if absent)
    C,
    S,
    n_sb,  # spatial blocks per batch entry: cdiv(S, BS)
    eps,
    scale,
    x_strides,  # x's and y's (n, c, s) element strides, tuples
    y_strides,
    wb_strides,  # gamma's and bias's element strides along their channel axis
    BC: tl.constexpr,  # channels per chunk (power of two); NCH == 1: the first piece
    BC1: tl.constexpr,  # NCH == 1: the second piece of the column (power of two, or 0)
    BS: tl.constexpr,  # positions per program (power of two)
    NCH: tl.constexpr,  # chunks: cdiv(C, BC); 1 = the column is held in registers
    FIN: tl.constexpr,  # FinishFlags (has_w: gamma)
    OFF64: tl.constexpr,  # NCH == 1: offsets inside the column block need int64
    EVEN: tl.constexpr,  # NCH == 1: BC + BC1 == C and BS | S: no masks
):
    """x / max(||x||_2 over channels, eps) * scale * gamma + bias [then SiLU], per position.

    A column held in registers is two power-of-two pieces, channels [0, BC) and [BC, BC +
    BC1): 96 channels as 64 + 32 rather than 128 with a quarter masked (the kernel is bound
    by instruction issue: masked lanes cost as much as real ones)."""
    ACT: tl.constexpr = x_ptr.dtype.element_ty
    pid = tl.program_id(0).to(tl.int64)
    n = pid // n_sb
    sb = pid - n * n_sb
    if NCH == 1:
        # int64 corner, int32 offsets inside the column block (unless OFF64); no masks when
        # the pieces cover C exactly and BS divides S (EVEN): the kernel is issue-bound
        c0 = tl.arange(0, BC)[:, None]
        si = tl.arange(0, BS)[None, :]
        x0p = x_ptr + (n * x_strides[0] + (sb * BS) * x_strides[2])
        y0p = y_ptr + (n * y_strides[0] + (sb * BS) * y_strides[2])
        xo = _tile_offsets(c0, si, x_strides[1], x_strides[2], OFF64)
        yo = _tile_offsets(c0, si, y_strides[1], y_strides[2], OFF64)
        if BC1 > 0:
            c1 = BC + tl.arange(0, BC1)[:, None]
            xo1 = _tile_offsets(c1, si, x_strides[1], x_strides[2], OFF64)
            yo1 = _tile_offsets(c1, si, y_strides[1], y_strides[2], OFF64)
        if EVEN:
            cm = None
            m = None
            cm1 = None
            m1 = None
        else:
            cm = c0 < C
            m = cm & (si < tl.minimum(S - sb * BS, BS).to(tl.int32))
            if BC1 > 0:
                cm1 = c1 < C
                m1 = cm1 & (si < tl.minimum(S - sb * BS, BS).to(tl.int32))
        # every load of the program ahead of the sum's barrier, gamma / bias first: a load
        # placed after a sum (or after a use of x) waits for it, and each such wait is one
        # more memory round trip a program
        gm = _load_channels(g_ptr, c0, wb_strides[0], cm, FIN.has_w, EVEN, 1.0)
        b = _load_channels(b_ptr, c0, wb_strides[1], cm, FIN.has_b, EVEN, 0.0)
        if BC1 > 0:
            gm1 = _load_channels(g_ptr, c1, wb_strides[0], cm1, FIN.has_w, EVEN, 1.0)
            b1 = _load_channels(b_ptr, c1, wb_strides[1], cm1, FIN.has_b, EVEN, 0.0)
        x = _load_f32(x0p + xo, m, EVEN, "")
        if BC1 > 0:
            x1 = _load_f32(x0p + xo1, m1, EVEN, "")
            # one cross-warp reduction, not two: fold the first piece onto the second's
            # height (BC1 divides BC; in-thread adds when the layout repeats along rows)
            sq = tl.sum(tl.reshape(x * x, (BC // BC1, BC1, BS)), 0) + x1 * x1
            ss = tl.sum(sq, 0)[None, :]
        else:
            ss = tl.sum(x * x, 0)[None, :]
        inv = 1.0 / tl.maximum(tl.sqrt_rn(ss), eps)
        _rms_finish(x, inv, scale, (gm, b), (y0p, yo), m, FIN, ACT)
        if BC1 > 0:
            _rms_finish(x1, inv, scale, (gm1, b1), (y0p, yo1), m1, FIN, ACT)
    else:
        # a column too tall for registers: sum of squares over channel chunks (one pass
        # loses nothing here: every term is positive), then re-read (from L1/L2) and apply
        s = sb * BS + tl.arange(0, BS)[None, :].to(tl.int64)
        sm = s < S
        ci = tl.arange(0, BC)[:, None].to(tl.int64)
        xb = n * x_strides[0] + s * x_strides[2]
        yb = n * y_strides[0] + s * y_strides[2]
        ss = tl.zeros((1, BS), tl.float32)
        for k in range(NCH):
            c = k * BC + ci
            m = (c < C) & sm
            x = tl.load(x_ptr + xb + c * x_strides[1], mask=m, other=0.0).to(tl.float32)
            ss += tl.sum(x * x, 0)[None, :]
        inv = 1.0 / tl.maximum(tl.sqrt_rn(ss), eps)
        for k in range(NCH):
            c = k * BC + ci
            cm = c < C
            m = cm & sm
            x = tl.load(x_ptr + xb + c * x_strides[1], mask=m, other=0.0).to(tl.float32)
            gm = _load_channels(g_ptr, c, wb_strides[0], cm, FIN.has_w, False, 1.0)
            b = _load_channels(b_ptr, c, wb_strides[1], cm, FIN.has_b, False, 0.0)
            _rms_finish(x, inv, scale, (gm, b), (y_ptr, yb + c * y_strides[1]), m, FIN, ACT)
