"""AdaLN modulation and gated-residual kernels: ``[x + y * gate ->] norm -> * (1 + scale) +
shift``, rows in registers (tile kernel), chunked long rows, and the flat residual.

Launched by :mod:`ditfuse.ops.adaln` (settings, checks, public functions); design and
measurements: docs/design/adaln.md."""
from __future__ import annotations

import triton.language as tl

from ditfuse.kernels.element import _cast_out, _rnd
from ditfuse.runtime.backend import jit


@jit
def _vec(ptr, base, d, m, stride_d, ON: tl.constexpr):
    """An operand tile as fp32 (any shape ``base + d * stride_d`` broadcasts to), or a
    placeholder when the operand is absent."""
    if ON:
        return tl.load(ptr + base + d * stride_d, mask=m, other=0.0).to(tl.float32)
    else:
        return 0.0


@jit
def _residual(x, y, g, RESIDUAL: tl.constexpr, HAS_GATE: tl.constexpr, PER_OP: tl.constexpr,
              ACT: tl.constexpr):
    """x, or the new residual x + y * gate rounded to x's dtype as the model stores it."""
    if RESIDUAL:
        if HAS_GATE:
            y = y * g
            if PER_OP:
                y = _rnd(y, ACT)
        x = _rnd(x + y, ACT)
    return x


@jit
def _rows_in(x_ptr, y_ptr, gate_ptr, xb, yb, gb, d, m, stride_xd, stride_yd, stride_gd,
             RESIDUAL: tl.constexpr, HAS_GATE: tl.constexpr, PER_OP: tl.constexpr,
             ACT: tl.constexpr):
    """x (or the new residual x + y * gate, rounded to x's dtype as the model stores it)."""
    x = _vec(x_ptr, xb, d, m, stride_xd, True)
    y = _vec(y_ptr, yb, d, m, stride_yd, RESIDUAL)
    g = _vec(gate_ptr, gb, d, m, stride_gd, RESIDUAL and HAS_GATE)
    return _residual(x, y, g, RESIDUAL, HAS_GATE, PER_OP, ACT)


@jit
def _modulate(n, m, d, w_ptr, b_ptr, shift_ptr, scale_ptr, shb, scb, stride_shd, stride_scd,
              HAS_W: tl.constexpr, HAS_B: tl.constexpr, HAS_SHIFT: tl.constexpr,
              HAS_SCALE: tl.constexpr, PER_OP: tl.constexpr, ACT: tl.constexpr):
    """The affine and the modulation in the eager chain's order and roundings (both kernels).
    Each operand is loaded where it is used: loading them all first costs the one-row
    kernel 8 registers a thread at Wan's shape, one resident program per SM."""
    if HAS_W:
        n = n * _vec(w_ptr, 0, d, m, 1, True)
    if HAS_B:
        n = n + _vec(b_ptr, 0, d, m, 1, True)
    if PER_OP:
        n = _rnd(n, ACT)
    if HAS_SCALE:
        t = 1.0 + _vec(scale_ptr, scb, d, m, stride_scd, True)
        if PER_OP:
            t = _rnd(t, ACT)
        n = n * t
        if PER_OP:
            n = _rnd(n, ACT)
    if HAS_SHIFT:
        n = n + _vec(shift_ptr, shb, d, m, stride_shd, True)
    return n


@jit
def _adaln_kernel(
    x_ptr,                     # residual stream in, (B, S, D) any strides
    y_ptr, gate_ptr,           # branch output and its gate (RESIDUAL / HAS_GATE)
    shift_ptr, scale_ptr,      # modulation, broadcast by stride 0
    w_ptr, b_ptr,              # norm affine (D,)
    xnew_ptr,                  # new residual stream out (RESIDUAL; may be x itself)
    out_ptr,                   # modulated output
    S, D, eps,
    stride_xb, stride_xs, stride_xd,
    stride_yb, stride_ys, stride_yd,
    stride_gb, stride_gs, stride_gd,
    stride_shb, stride_shs, stride_shd,
    stride_scb, stride_scs, stride_scd,
    stride_nb, stride_ns, stride_nd,
    stride_ob, stride_os, stride_od,
    NORM: tl.constexpr,        # 0 none, 1 LayerNorm, 2 RMSNorm
    HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    RESIDUAL: tl.constexpr, HAS_GATE: tl.constexpr,
    HAS_SHIFT: tl.constexpr, HAS_SCALE: tl.constexpr,
    PER_OP: tl.constexpr,      # round every step to x's dtype (a half-precision eager chain)
    HAS_OUT: tl.constexpr,     # False: the gated residual alone (no norm, no modulated output)
    BLOCK_D: tl.constexpr, NUM_CHUNKS: tl.constexpr,
):
    """Rows longer than the tile kernel holds (D > 8192), one row a program, in NUM_CHUNKS
    chunks of BLOCK_D."""
    ACT: tl.constexpr = x_ptr.dtype.element_ty
    row = tl.program_id(0).to(tl.int64)
    b = row // S
    s = row - b * S
    xb = b * stride_xb + s * stride_xs
    yb = b * stride_yb + s * stride_ys
    gb = b * stride_gb + s * stride_gs
    shb = b * stride_shb + s * stride_shs
    scb = b * stride_scb + s * stride_scs
    nb = b * stride_nb + s * stride_ns
    ob = b * stride_ob + s * stride_os
    dd = tl.arange(0, BLOCK_D)
    if not HAS_OUT:  # the gated residual alone
        for c in range(NUM_CHUNKS):
            d = c * BLOCK_D + dd
            m = d < D
            x = _rows_in(x_ptr, y_ptr, gate_ptr, xb, yb, gb, d, m, stride_xd, stride_yd,
                         stride_gd, RESIDUAL, HAS_GATE, PER_OP, ACT)
            tl.store(xnew_ptr + nb + d * stride_nd, _cast_out(x, ACT), mask=m)
    else:
        # pass 1: statistics by chunks (Chan's combination of count, mean, M2), storing the
        # new residual stream on the way; pass 2 re-reads the row (from L2) and applies.
        cnt = 0.0
        mean = 0.0
        m2 = 0.0
        for c in range(NUM_CHUNKS):
            d = c * BLOCK_D + dd
            m = d < D
            x = _rows_in(x_ptr, y_ptr, gate_ptr, xb, yb, gb, d, m, stride_xd, stride_yd,
                         stride_gd, RESIDUAL, HAS_GATE, PER_OP, ACT)
            if RESIDUAL:
                tl.store(xnew_ptr + nb + d * stride_nd, _cast_out(x, ACT), mask=m)
            nc = tl.sum(m.to(tl.float32), 0)
            if NORM == 1:
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
        rstd = 1.0 / tl.sqrt(m2 / D + eps)  # m2: sum of squared deviations (layer) or squares
        for c in range(NUM_CHUNKS):
            d = c * BLOCK_D + dd
            m = d < D
            if RESIDUAL:
                x = tl.load(xnew_ptr + nb + d * stride_nd, mask=m, other=0.0).to(tl.float32)
            else:
                x = tl.load(x_ptr + xb + d * stride_xd, mask=m, other=0.0).to(tl.float32)
            if NORM == 1:
                n = (x - mean) * rstd
            elif NORM == 2:
                n = x * rstd
            else:
                n = x
            n = _modulate(n, m, d, w_ptr, b_ptr, shift_ptr, scale_ptr, shb, scb, stride_shd,
                          stride_scd, HAS_W, HAS_B, HAS_SHIFT, HAS_SCALE, PER_OP, ACT)
            tl.store(out_ptr + ob + d * stride_od, _cast_out(n, out_ptr.dtype.element_ty),
                     mask=m)


@jit
def _adaln_tile_kernel(
    x_ptr, y_ptr, gate_ptr, shift_ptr, scale_ptr, w_ptr, b_ptr, xnew_ptr, out_ptr,
    S, D, eps,
    stride_xb, stride_xs, stride_xd,
    stride_yb, stride_ys, stride_yd,
    stride_gb, stride_gs, stride_gd,
    stride_shb, stride_shs, stride_shd,
    stride_scb, stride_scs, stride_scd,
    stride_nb, stride_ns, stride_nd,
    stride_ob, stride_os, stride_od,
    NORM: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    RESIDUAL: tl.constexpr, HAS_GATE: tl.constexpr,
    HAS_SHIFT: tl.constexpr, HAS_SCALE: tl.constexpr, PER_OP: tl.constexpr,
    HAS_OUT: tl.constexpr,
    ROWS: tl.constexpr,        # token rows per program, one [ROWS, D] tile
    BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr,  # D as two power-of-two pieces (B may be 0)
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
    b = tl.program_id(0 if BATCH_X else 1).to(tl.int64)
    s = tl.program_id(1 if BATCH_X else 0).to(tl.int64) * ROWS + \
        tl.arange(0, ROWS)[:, None].to(tl.int64)
    rm = s < S
    da = tl.arange(0, BLOCK_A)[None, :]
    ma = rm & (da < D)
    xo = b * stride_xb + s * stride_xs
    yo = b * stride_yb + s * stride_ys
    # per-row bases of the modulation rows: stride 0 along S unless per token (TI2V)
    go = b * stride_gb + s * stride_gs
    sho = b * stride_shb + s * stride_shs
    sco = b * stride_scb + s * stride_scs
    xa = _vec(x_ptr, xo, da, ma, stride_xd, True)
    if RESIDUAL:
        ya = _vec(y_ptr, yo, da, ma, stride_yd, True)
    if BLOCK_B > 0:
        db = BLOCK_A + tl.arange(0, BLOCK_B)[None, :]
        mb = rm & (db < D)
        xb = _vec(x_ptr, xo, db, mb, stride_xd, True)
        if RESIDUAL:
            yb = _vec(y_ptr, yo, db, mb, stride_yd, True)
    if RESIDUAL:
        ga = _vec(gate_ptr, go, da, ma, stride_gd, HAS_GATE)
        xa = _residual(xa, ya, ga, RESIDUAL, HAS_GATE, PER_OP, ACT)
        no = b * stride_nb + s * stride_ns
        tl.store(xnew_ptr + no + da * stride_nd, _cast_out(xa, ACT), mask=ma)
        if BLOCK_B > 0:
            gbv = _vec(gate_ptr, go, db, mb, stride_gd, HAS_GATE)
            xb = _residual(xb, yb, gbv, RESIDUAL, HAS_GATE, PER_OP, ACT)
            tl.store(xnew_ptr + no + db * stride_nd, _cast_out(xb, ACT), mask=mb)
    if HAS_OUT:
        if NORM == 1:
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
        elif NORM == 2:
            q = tl.sum(xa * xa, 1)
            if BLOCK_B > 0:
                q += tl.sum(xb * xb, 1)
            rstd = (1.0 / tl.sqrt(q / D + eps))[:, None]
            na = xa * rstd
            if BLOCK_B > 0:
                nb = xb * rstd
        else:
            na = xa
            if BLOCK_B > 0:
                nb = xb
        oo = b * stride_ob + s * stride_os
        na = _modulate(na, ma, da, w_ptr, b_ptr, shift_ptr, scale_ptr, sho, sco, stride_shd,
                       stride_scd, HAS_W, HAS_B, HAS_SHIFT, HAS_SCALE, PER_OP, ACT)
        tl.store(out_ptr + oo + da * stride_od, _cast_out(na, out_ptr.dtype.element_ty), mask=ma)
        if BLOCK_B > 0:
            nb = _modulate(nb, mb, db, w_ptr, b_ptr, shift_ptr, scale_ptr, sho, sco, stride_shd,
                           stride_scd, HAS_W, HAS_B, HAS_SHIFT, HAS_SCALE, PER_OP, ACT)
            tl.store(out_ptr + oo + db * stride_od, _cast_out(nb, out_ptr.dtype.element_ty),
                     mask=mb)


@jit
def _residual_flat_kernel(
    x_ptr, y_ptr, gate_ptr, xnew_ptr,
    S,
    stride_xb, stride_yb, stride_nb,       # batch strides (rows are contiguous: (S, D) dense)
    stride_gb, stride_gs, stride_gd,
    D: tl.constexpr,                       # channels of a row (compile-time: s, d by shifts
                                           # and a multiply, as inductor's kernel has them)
    HAS_GATE: tl.constexpr, GATE_PER_TOKEN: tl.constexpr, PER_OP: tl.constexpr,
    EVEN: tl.constexpr,                    # S * D a multiple of BLOCK: no masks
    OFF64: tl.constexpr,                   # S * D (or the gate's extent) past 2^31: int64
                                           # offsets within an entry
    BLOCK: tl.constexpr,
    BATCH_X: tl.constexpr = False,         # grid (B, blocks): more than 65535 batch entries
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
        go = b * stride_gb + d * stride_gd
        if GATE_PER_TOKEN:
            go += s * stride_gs
        if EVEN:
            g = tl.load(gate_ptr + go).to(tl.float32)
        else:
            g = tl.load(gate_ptr + go, mask=m, other=0.0).to(tl.float32)
    r = _cast_out(_residual(x, y, g, True, HAS_GATE, PER_OP, ACT), ACT)
    if EVEN:
        tl.store(xnew_ptr + b * stride_nb + i, r)
    else:
        tl.store(xnew_ptr + b * stride_nb + i, r, mask=m)
