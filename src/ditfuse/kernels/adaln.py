"""AdaLN modulation and gated-residual kernels: ``[x + y * gate ->] norm -> * (1 + scale) +
shift``, rows in registers (tile kernel), chunked long rows, and the flat residual.

Launched by :mod:`ditfuse.ops.adaln` (settings, checks, public functions); design and
measurements: docs/design/adaln.md."""

from __future__ import annotations

from typing import NamedTuple

import triton.language as tl

from ditfuse.kernels.element import _cast_out, _rnd
from ditfuse.kernels.linear_fp8 import _max_nan, _row_amax, _row_scale, _store_e4m3
from ditfuse.runtime.backend import jit

#: the norm the kernels apply (``AdaLNFlags.norm``); the values are the ``ditfuse::adaln`` ops'
#: ``norm`` argument
NO_NORM = tl.constexpr(0)
LAYER_NORM = tl.constexpr(1)
RMS_NORM = tl.constexpr(2)


@jit
def _vec(ptr, base, d, m, stride_d, ON: tl.constexpr):
    """An operand tile as fp32 (any shape ``base + d * stride_d`` broadcasts to), or a
    placeholder when the operand is absent."""
    if ON:
        return tl.load(ptr + base + d * stride_d, mask=m, other=0.0).to(tl.float32)
    else:
        return 0.0


@jit
def _residual(
    x, y, g, RESIDUAL: tl.constexpr, HAS_GATE: tl.constexpr, PER_OP: tl.constexpr, ACT: tl.constexpr
):
    """x, or the new residual x + y * gate rounded to x's dtype as the model stores it."""
    if RESIDUAL:
        if HAS_GATE:
            y = y * g
            if PER_OP:
                y = _rnd(y, ACT)
        x = _rnd(x + y, ACT)
    return x


@jit
def _rows_in(
    xin, yin, gin, d, m, RESIDUAL: tl.constexpr, HAS_GATE: tl.constexpr, PER_OP: tl.constexpr
):
    """x (or the new residual x + y * gate, rounded to x's dtype as the model stores it).
    ``xin``, ``yin``, ``gin``: (pointer, row offsets, channel stride) of x, y and the gate."""
    ACT: tl.constexpr = xin[0].dtype.element_ty
    x = _vec(xin[0], xin[1], d, m, xin[2], True)
    y = _vec(yin[0], yin[1], d, m, yin[2], RESIDUAL)
    g = _vec(gin[0], gin[1], d, m, gin[2], RESIDUAL and HAS_GATE)
    return _residual(x, y, g, RESIDUAL, HAS_GATE, PER_OP, ACT)


class AdaLNFlags(NamedTuple):
    """The steps an AdaLN kernel compiles (its ``FLAGS``)."""

    norm: int  # NO_NORM, LAYER_NORM or RMS_NORM
    has_w: bool
    has_b: bool  # the norm's affine
    residual: bool
    has_gate: bool  # x + y [* gate] first
    has_shift: bool
    has_scale: bool
    per_op: bool  # every step rounded to x's dtype (a half-precision eager chain)
    has_out: bool  # False: the gated residual alone (no norm, no modulated output)


class RowStrides(NamedTuple):
    """Each (B, S, D) operand's (b, s, d) element strides, a tuple (an AdaLN kernel's
    ``strides``)."""

    x: tuple
    y: tuple
    gate: tuple
    shift: tuple
    scale: tuple
    xnew: tuple
    out: tuple


@jit
def _modulate(n, m, d, affine, shift, scale, MOD: tl.constexpr, ACT: tl.constexpr):
    """The affine and the modulation of the normalized tile ``n`` in the eager chain's order
    and roundings (every kernel), fp32 before the output's rounding. ``affine``: the (w, b)
    pointers; ``shift``, ``scale``: (pointer, row offsets, channel stride); ``MOD``: the
    kernel's :class:`AdaLNFlags`. Each operand is loaded where it is used: loading them all
    first costs the one-row kernel 8 registers a thread at Wan's shape, one resident program
    per SM."""
    w_ptr, b_ptr = affine
    if MOD.has_w:
        n = n * _vec(w_ptr, 0, d, m, 1, True)
    if MOD.has_b:
        n = n + _vec(b_ptr, 0, d, m, 1, True)
    if MOD.per_op:
        n = _rnd(n, ACT)
    if MOD.has_scale:
        t = 1.0 + _vec(scale[0], scale[1], d, m, scale[2], True)
        if MOD.per_op:
            t = _rnd(t, ACT)
        n = n * t
        if MOD.per_op:
            n = _rnd(n, ACT)
    if MOD.has_shift:
        n = n + _vec(shift[0], shift[1], d, m, shift[2], True)
    return n


@jit
def _modulate_out(n, m, d, affine, shift, scale, out, MOD: tl.constexpr, ACT: tl.constexpr):
    """:func:`_modulate` of ``n`` stored to the output ``out`` (pointer, row offsets,
    channel stride) in its dtype."""
    n = _modulate(n, m, d, affine, shift, scale, MOD, ACT)
    out_ptr, ob, stride_od = out
    tl.store(out_ptr + ob + d * stride_od, _cast_out(n, out_ptr.dtype.element_ty), mask=m)


@jit
def _row(strides, b, s):
    """The offset of row (b, s) of a (B, S, D) tensor with (b, s, d) ``strides``."""
    return b * strides[0] + s * strides[1]


@jit
def _adaln_kernel(
    x_ptr,  # residual stream in, (B, S, D) any strides
    y_ptr,
    gate_ptr,  # branch output and its gate (RESIDUAL / HAS_GATE)
    shift_ptr,
    scale_ptr,  # modulation, broadcast by stride 0
    w_ptr,
    b_ptr,  # norm affine (D,)
    xnew_ptr,  # new residual stream out (RESIDUAL; may be x itself)
    out_ptr,  # modulated output
    S,
    D,
    eps,
    strides,  # RowStrides
    FLAGS: tl.constexpr,  # AdaLNFlags
    BLOCK_D: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
):
    """Rows longer than the tile kernel holds (D > 8192), one row a program, in NUM_CHUNKS
    chunks of BLOCK_D."""
    ACT: tl.constexpr = x_ptr.dtype.element_ty
    RESIDUAL: tl.constexpr = FLAGS.residual
    HAS_OUT: tl.constexpr = FLAGS.has_out
    row = tl.program_id(0).to(tl.int64)
    b = row // S
    s = row - b * S
    xb = _row(strides.x, b, s)
    yb = _row(strides.y, b, s)
    gb = _row(strides.gate, b, s)
    shift = (shift_ptr, _row(strides.shift, b, s), strides.shift[2])
    scale = (scale_ptr, _row(strides.scale, b, s), strides.scale[2])
    nb = _row(strides.xnew, b, s)
    out = (out_ptr, _row(strides.out, b, s), strides.out[2])
    dd = tl.arange(0, BLOCK_D)
    # pass 1: the new residual stream stored on the way (without an output: all there is to
    # do) and the statistics by chunks (Chan's combination of count, mean, M2); pass 2
    # re-reads the row (from L2) and applies.
    cnt = 0.0
    mean = 0.0
    m2 = 0.0
    for c in range(NUM_CHUNKS):
        d = c * BLOCK_D + dd
        m = d < D
        x = _rows_in(
            (x_ptr, xb, strides.x[2]),
            (y_ptr, yb, strides.y[2]),
            (gate_ptr, gb, strides.gate[2]),
            d,
            m,
            RESIDUAL=RESIDUAL,
            HAS_GATE=FLAGS.has_gate,
            PER_OP=FLAGS.per_op,
        )
        if RESIDUAL or not HAS_OUT:
            tl.store(xnew_ptr + nb + d * strides.xnew[2], _cast_out(x, ACT), mask=m)
        if HAS_OUT:
            nc = tl.sum(m.to(tl.float32), 0)
            if FLAGS.norm == LAYER_NORM:
                mc = tl.sum(x, 0) / nc
                xc = tl.where(m, x - mc, 0.0)
                m2c = tl.sum(xc * xc, 0)
                tot = cnt + nc
                delta = mc - mean
                mean = mean + delta * (nc / tot)
                m2 = m2 + m2c + delta * delta * (cnt * nc / tot)
                cnt = tot
            else:
                m2 = m2 + tl.sum(x * x, 0)
                cnt = cnt + nc
    if HAS_OUT:
        rstd = 1.0 / tl.sqrt(m2 / D + eps)  # m2: sum of squared deviations (layer) or squares
        for c in range(NUM_CHUNKS):
            d = c * BLOCK_D + dd
            m = d < D
            if RESIDUAL:
                x = tl.load(xnew_ptr + nb + d * strides.xnew[2], mask=m, other=0.0).to(tl.float32)
            else:
                x = tl.load(x_ptr + xb + d * strides.x[2], mask=m, other=0.0).to(tl.float32)
            if FLAGS.norm == LAYER_NORM:
                n = (x - mean) * rstd
            elif FLAGS.norm == RMS_NORM:
                n = x * rstd
            else:
                n = x
            _modulate_out(n, m, d, (w_ptr, b_ptr), shift, scale, out, FLAGS, ACT)


@jit
def _tile(
    ins,  # the x, y, gate, shift, scale, w, b pointers
    xnew_ptr,
    S,
    D,
    eps,
    strides,
    FLAGS: tl.constexpr,
    ROWS: tl.constexpr,
    BLOCK_A: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BATCH_X: tl.constexpr,
):
    """The tile kernels' loads, gated residual (stored to ``xnew_ptr``) and norm of ROWS rows:
    returns the rows (b, s) and the normalized pieces with their masks and channels, ``(na,
    ma, da)`` and ``(nb, mb, db)`` (placeholders when BLOCK_B is 0), for the modulation."""
    x_ptr, y_ptr, gate_ptr, shift_ptr, scale_ptr, w_ptr, b_ptr = ins
    ACT: tl.constexpr = x_ptr.dtype.element_ty
    RESIDUAL: tl.constexpr = FLAGS.residual
    HAS_GATE: tl.constexpr = FLAGS.has_gate
    PER_OP: tl.constexpr = FLAGS.per_op
    b = tl.program_id(0 if BATCH_X else 1).to(tl.int64)
    s = tl.program_id(1 if BATCH_X else 0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None].to(
        tl.int64
    )
    rm = s < S
    da = tl.arange(0, BLOCK_A)[None, :]
    ma = rm & (da < D)
    xo = _row(strides.x, b, s)
    yo = _row(strides.y, b, s)
    # per-row bases of the modulation rows: stride 0 along S unless per token (TI2V)
    go = _row(strides.gate, b, s)
    xa = _vec(x_ptr, xo, da, ma, strides.x[2], True)
    if RESIDUAL:
        ya = _vec(y_ptr, yo, da, ma, strides.y[2], True)
    db = da
    mb = ma
    xb = xa
    if BLOCK_B > 0:
        db = BLOCK_A + tl.arange(0, BLOCK_B)[None, :]
        mb = rm & (db < D)
        xb = _vec(x_ptr, xo, db, mb, strides.x[2], True)
        if RESIDUAL:
            yb = _vec(y_ptr, yo, db, mb, strides.y[2], True)
    if RESIDUAL:
        ga = _vec(gate_ptr, go, da, ma, strides.gate[2], HAS_GATE)
        xa = _residual(xa, ya, ga, RESIDUAL, HAS_GATE, PER_OP, ACT)
        no = _row(strides.xnew, b, s)
        tl.store(xnew_ptr + no + da * strides.xnew[2], _cast_out(xa, ACT), mask=ma)
        if BLOCK_B > 0:
            gbv = _vec(gate_ptr, go, db, mb, strides.gate[2], HAS_GATE)
            xb = _residual(xb, yb, gbv, RESIDUAL, HAS_GATE, PER_OP, ACT)
            tl.store(xnew_ptr + no + db * strides.xnew[2], _cast_out(xb, ACT), mask=mb)
    na = xa
    nb = xb
    if FLAGS.has_out:
        if FLAGS.norm == LAYER_NORM:
            tot = tl.sum(xa, 1)
            if BLOCK_B > 0:
                tot += tl.sum(xb, 1)
            mean = (tot / D)[:, None]
            ca = tl.where(ma, xa - mean, 0.0)
            q = tl.sum(ca * ca, 1)
            if BLOCK_B > 0:
                cb = tl.where(mb, xb - mean, 0.0)
                q += tl.sum(cb * cb, 1)
            rstd = (1.0 / tl.sqrt(q / D + eps))[:, None]
            na = ca * rstd
            if BLOCK_B > 0:
                nb = cb * rstd
        elif FLAGS.norm == RMS_NORM:
            q = tl.sum(xa * xa, 1)
            if BLOCK_B > 0:
                q += tl.sum(xb * xb, 1)
            rstd = (1.0 / tl.sqrt(q / D + eps))[:, None]
            na = xa * rstd
            if BLOCK_B > 0:
                nb = xb * rstd
    return b, s, (na, ma, da), (nb, mb, db)


@jit
def _adaln_tile_kernel(
    x_ptr,
    y_ptr,
    gate_ptr,
    shift_ptr,
    scale_ptr,
    w_ptr,
    b_ptr,
    xnew_ptr,
    out_ptr,
    S,
    D,
    eps,
    strides,  # RowStrides
    FLAGS: tl.constexpr,  # AdaLNFlags
    ROWS: tl.constexpr,  # token rows per program, one [ROWS, D] tile
    BLOCK_A: tl.constexpr,
    BLOCK_B: tl.constexpr,  # D as two power-of-two pieces (B may be 0)
    BATCH_X: tl.constexpr = False,  # grid (B, row blocks): more than 65535 batch entries
):
    """The kernel for rows of up to 8192 channels: ROWS rows of one batch entry
    as a 2-D tile, every row's loads issued before any store (so they overlap), the row
    held as two power-of-two pieces (5120 = 4096 + 1024: no masked lanes), few warps per
    program so that many rows are in flight per SM. The steps of the eager chain in its
    order and roundings (``_residual``, ``_modulate``); the row statistics are two-pass,
    summed in the kernel's own order, so the output is within one rounding of eager code
    (x_new: bitwise)."""
    ACT: tl.constexpr = x_ptr.dtype.element_ty
    ins = (x_ptr, y_ptr, gate_ptr, shift_ptr, scale_ptr, w_ptr, b_ptr)
    b, s, pa, pb = _tile(ins, xnew_ptr, S, D, eps, strides, FLAGS, ROWS, BLOCK_A, BLOCK_B, BATCH_X)
    if FLAGS.has_out:
        shift = (shift_ptr, _row(strides.shift, b, s), strides.shift[2])
        scale = (scale_ptr, _row(strides.scale, b, s), strides.scale[2])
        out = (out_ptr, _row(strides.out, b, s), strides.out[2])
        _modulate_out(pa[0], pa[1], pa[2], (w_ptr, b_ptr), shift, scale, out, FLAGS, ACT)
        if BLOCK_B > 0:
            _modulate_out(pb[0], pb[1], pb[2], (w_ptr, b_ptr), shift, scale, out, FLAGS, ACT)


@jit
def _runs_of_8(d):
    """The channels ``d``, seen by the compiler as runs of 8 contiguous ones: the e4m3 store
    then takes the 16-bit loads' layout (8 elements a thread) instead of 16 bytes a thread,
    which would move every row through shared memory to change layouts."""
    return (d // 8) * 8 + d % 8


@jit
def _adaln_fp8_tile_kernel(
    x_ptr,
    y_ptr,
    gate_ptr,
    shift_ptr,
    scale_ptr,
    w_ptr,
    b_ptr,
    xnew_ptr,
    q_ptr,  # the modulated output in e4m3, rows of D (row stride D)
    qscale_ptr,  # its fp32 scale a row (B * S,)
    S,
    D,
    eps,
    strides,  # RowStrides (``out``: q's)
    FLAGS: tl.constexpr,  # AdaLNFlags (has_out)
    ROWS: tl.constexpr,
    BLOCK_A: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BATCH_X: tl.constexpr = False,
):
    """:func:`_adaln_tile_kernel` whose modulated rows, rounded to x's dtype as the 16-bit
    kernel stores them, are written in float8 e4m3 with one fp32 scale a row: the FP8
    linear's input (:func:`ditfuse.kernels.linear_fp8._quantize_rows_kernel`'s arithmetic,
    bitwise that kernel on the 16-bit output). The 16-bit output is never written."""
    ACT: tl.constexpr = x_ptr.dtype.element_ty
    ins = (x_ptr, y_ptr, gate_ptr, shift_ptr, scale_ptr, w_ptr, b_ptr)
    b, s, pa, pb = _tile(ins, xnew_ptr, S, D, eps, strides, FLAGS, ROWS, BLOCK_A, BLOCK_B, BATCH_X)
    shift = (shift_ptr, _row(strides.shift, b, s), strides.shift[2])
    scale = (scale_ptr, _row(strides.scale, b, s), strides.scale[2])
    va = _rnd(_modulate(pa[0], pa[1], pa[2], (w_ptr, b_ptr), shift, scale, FLAGS, ACT), ACT)
    va = tl.where(pa[1], va, 0.0)
    # one cross-warp reduction a piece
    amax = _row_amax(va)
    vb = va
    if BLOCK_B > 0:
        vb = _rnd(_modulate(pb[0], pb[1], pb[2], (w_ptr, b_ptr), shift, scale, FLAGS, ACT), ACT)
        vb = tl.where(pb[1], vb, 0.0)
        amax = _max_nan(amax, _row_amax(vb))
    rows = b * S + s  # (ROWS, 1): q's rows and the scales' index
    has_nan, inv, row_scale = _row_scale(amax[:, None])
    tl.store(qscale_ptr + rows, row_scale, mask=s < S)
    qo = _row(strides.out, b, s)
    _store_e4m3(q_ptr + qo + _runs_of_8(pa[2]) * strides.out[2], va, inv, has_nan, pa[1])
    if BLOCK_B > 0:
        _store_e4m3(q_ptr + qo + _runs_of_8(pb[2]) * strides.out[2], vb, inv, has_nan, pb[1])


@jit
def _residual_flat_kernel(
    x_ptr,
    y_ptr,
    gate_ptr,
    xnew_ptr,
    S,
    stride_xb,
    stride_yb,
    stride_nb,  # batch strides (rows are contiguous: (S, D) dense)
    gate_strides,  # the gate's (b, s, d) element strides, a tuple
    D: tl.constexpr,  # channels of a row (compile-time: s, d by shifts
    # and a multiply, as inductor's kernel has them)
    HAS_GATE: tl.constexpr,
    GATE_PER_TOKEN: tl.constexpr,
    PER_OP: tl.constexpr,
    EVEN: tl.constexpr,  # S * D a multiple of BLOCK: no masks
    OFF64: tl.constexpr,  # S * D (or the gate's extent) past 2^31: int64
    # offsets within an entry
    BLOCK: tl.constexpr,
    BATCH_X: tl.constexpr = False,  # grid (B, blocks): more than 65535 batch entries
):
    """The gated residual alone over a batch entry's S * D values as one flat run (x, y and
    x_new dense rows): ``BLOCK`` consecutive values a program, the gate row gathered by
    channel. The arithmetic of ``_residual`` (the tile kernel's), so the same bits."""
    ACT: tl.constexpr = x_ptr.dtype.element_ty
    b = tl.program_id(0 if BATCH_X else 1).to(tl.int64)
    blk = tl.program_id(1 if BATCH_X else 0)
    if OFF64:
        i = blk.to(tl.int64) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
        m = i < S.to(tl.int64) * D
    else:
        i = blk * BLOCK + tl.arange(0, BLOCK)
        m = i < S * D
    if EVEN:
        x = tl.load(x_ptr + b * stride_xb + i).to(tl.float32)
        y = tl.load(y_ptr + b * stride_yb + i).to(tl.float32)
    else:
        x = tl.load(x_ptr + b * stride_xb + i, mask=m, other=0.0).to(tl.float32)
        y = tl.load(y_ptr + b * stride_yb + i, mask=m, other=0.0).to(tl.float32)
    g = 0.0
    if HAS_GATE:
        s = i // D
        d = i - s * D
        go = b * gate_strides[0] + d * gate_strides[2]
        if GATE_PER_TOKEN:
            go += s * gate_strides[1]
        if EVEN:
            g = tl.load(gate_ptr + go).to(tl.float32)
        else:
            g = tl.load(gate_ptr + go, mask=m, other=0.0).to(tl.float32)
    r = _cast_out(_residual(x, y, g, True, HAS_GATE, PER_OP, ACT), ACT)
    if EVEN:
        tl.store(xnew_ptr + b * stride_nb + i, r)
    else:
        tl.store(xnew_ptr + b * stride_nb + i, r, mask=m)
