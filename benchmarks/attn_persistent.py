"""An experimental persistent band-attention kernel (session 9, not shipped; measure it in a
later session): the shipped kernel's per-tile code (``ditfuse._attn_kernel``, its helpers
imported) inside a loop over the query tiles of a persistent grid, each tile's key loop a
fixed number of trips, the tile loop ``tl.range(..., flatten=True)`` so that Triton
pipelines the key loads across tile boundaries (the shipped kernel's loop at SAME's window
is 4 trips of 32 keys: its pipeline fills and drains for every 64-query tile).

    TRITON_INTERPRET=1 python benchmarks/attn_persistent.py --check   # CPU: same bits as shipped
    TRITON_INTERPRET=0 python benchmarks/attn_persistent.py --build   # sm_90 registers / spills
    python benchmarks/attn_persistent.py                              # H200: graph time vs table
"""
import sys

import torch
import triton
import triton.language as tl

from ditfuse import attention as A
from ditfuse._attn_kernel import _key_tile, _load_qk, _tile_ptrs
from ditfuse._kernel_utils import _cast_out


@triton.jit
def _swa_persistent_kernel(
    q_ptr, k_ptr, v_ptr,      # (B, N, H, D) views, any strides
    q2_ptr, k2_ptr,           # second query/key (DIFF), same shape
    o_ptr,                    # output (B, N, H, D) view
    lam_ptr,                  # per-head lambda (LAM_PTR), any float dtype
    qw_ptr, qb_ptr, qa_ptr,   # Q norm weight, bias, DyT alpha tensor (Q_NORM)
    kw_ptr, kb_ptr, ka_ptr,   # K norm weight, bias, DyT alpha tensor (K_NORM)
    cos_ptr, sin_ptr,         # rotary tables, (B, N, H, W) broadcast views (ROPE)
    lam,                      # lambda as a Python float (not LAM_PTR)
    qk_scale,                 # softmax scale * log2(e)
    q_alpha, k_alpha,         # DyT alpha as Python floats
    q_eps, k_eps,
    N, H, LEFT, RIGHT,        # tokens, heads, window (unbounded sides passed as N)
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_q2b, stride_q2s, stride_q2h, stride_q2d,
    stride_k2b, stride_k2s, stride_k2h, stride_k2d,
    stride_ob, stride_os, stride_oh, stride_od,
    stride_lam,
    stride_cb, stride_cs, stride_ch, stride_cw,
    stride_sb, stride_ss, stride_sh, stride_sw,
    D: tl.constexpr,          # head_dim (32, 64 or 128)
    R: tl.constexpr,          # rotary channels (ROPE), even, <= D
    HALF_PAD: tl.constexpr,   # R / 2 padded to a power of two >= 16 (a dot's least K)
    PASS_PAD: tl.constexpr,   # D - R padded likewise
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DIFF: tl.constexpr,       # differential: out = Attn(q, k, v) - lambda * Attn(q2, k2, v)
    LAM_PTR: tl.constexpr,
    Q_NORM: tl.constexpr, Q_HAS_W: tl.constexpr, Q_HAS_B: tl.constexpr,
    Q_ALPHA_PTR: tl.constexpr, Q_ROUND_PRE_W: tl.constexpr,
    K_NORM: tl.constexpr, K_HAS_W: tl.constexpr, K_HAS_B: tl.constexpr,
    K_ALPHA_PTR: tl.constexpr, K_ROUND_PRE_W: tl.constexpr,
    ROPE: tl.constexpr, INTERLEAVED: tl.constexpr, TABLE_HALF: tl.constexpr,
    OFF64: tl.constexpr,
    TOKEN_MAJOR: tl.constexpr,  # unused here (tiles in token-major order)
    BH, N_M, NUM_PROGRAMS,    # (batch, head) pairs, query tiles, programs
    TRIPS: tl.constexpr,      # key tiles a query tile: cdiv(BLOCK_M + LEFT + RIGHT, BLOCK_N)
    ITERS: tl.constexpr,      # tiles a program: cdiv(BH * N_M, NUM_PROGRAMS)
    OUTER_STAGES: tl.constexpr,  # the tile loop's own pipelining (1: none)
    FLATTEN: tl.constexpr,
):
    ACT: tl.constexpr = q_ptr.dtype.element_ty
    # a persistent grid: program p takes tiles p, p + NUM_PROGRAMS, ... in token-major order
    # (tile = query tile * BH + (batch, head)); FLATTEN lets the compiler pipeline the key
    # loops of consecutive tiles as one loop (the 4-trip loop of one tile keeps little in
    # flight at its start and end)
    # ITERS (constexpr) trips of every program; a program past the last tile recomputes the
    # last tile and stores nothing (the interpreter cannot take program_id as a range bound)
    total = BH * N_M
    for it in tl.range(0, ITERS, num_stages=OUTER_STAGES, flatten=FLATTEN, disable_licm=True):
        tile = tl.program_id(0) + it * NUM_PROGRAMS
        live = tile < total
        tile = tl.minimum(tile, total - 1)
        bh = tile % BH
        start_m = (tile // BH) * BLOCK_M
        b = (bh // H).to(tl.int64)
        h = (bh % H).to(tl.int64)

        offs_m = start_m + tl.arange(0, BLOCK_M)
        qmask = offs_m < N
        cbase = b * stride_cb + h * stride_ch
        sbase = b * stride_sb + h * stride_sh

        qa, qb, qp = _load_qk(q_ptr, b * stride_qb + h * stride_qh, start_m, qmask, stride_qs,
                              stride_qd, qw_ptr, qb_ptr, qa_ptr, q_alpha, q_eps,
                              cos_ptr, sin_ptr, cbase, sbase, stride_cs, stride_cw, stride_ss,
                              stride_sw, D, R, HALF_PAD, PASS_PAD, BLOCK_M,
                              Q_NORM, Q_HAS_W, Q_HAS_B, Q_ALPHA_PTR, Q_ROUND_PRE_W,
                              ROPE, INTERLEAVED, TABLE_HALF, ACT, OFF64)
        m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l1 = tl.zeros([BLOCK_M], tl.float32)
        acc1 = tl.zeros([BLOCK_M, D], tl.float32)
        q2a = 0.0
        q2b = 0.0
        q2p = 0.0
        m2 = 0.0
        l2 = 0.0
        acc2 = 0.0
        if DIFF:
            q2a, q2b, q2p = _load_qk(q2_ptr, b * stride_q2b + h * stride_q2h, start_m, qmask,
                                     stride_q2s, stride_q2d, qw_ptr, qb_ptr, qa_ptr, q_alpha, q_eps,
                                     cos_ptr, sin_ptr, cbase, sbase, stride_cs, stride_cw,
                                     stride_ss, stride_sw, D, R, HALF_PAD, PASS_PAD, BLOCK_M,
                                     Q_NORM, Q_HAS_W, Q_HAS_B, Q_ALPHA_PTR, Q_ROUND_PRE_W,
                                     ROPE, INTERLEAVED, TABLE_HALF, ACT, OFF64)
            m2 = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l2 = tl.zeros([BLOCK_M], tl.float32)
            acc2 = tl.zeros([BLOCK_M, D], tl.float32)

        k_base = b * stride_kb + h * stride_kh
        k2_base = b * stride_k2b + h * stride_k2h
        v_base = b * stride_vb + h * stride_vh

        # only the keys of the band of this query tile, in BLOCK_N tiles from its first key
        # (not aligned to BLOCK_N: 64 queries at window 17 span 98 keys, two 64-key trips
        # where aligned tiles would take three)
        lo = tl.maximum(start_m - LEFT, 0)
        # each query row's band [i - LEFT, min(i + RIGHT, N - 1)] as its first key and width:
        # the key bound j < N folded in (rows past N are never stored; their width may be
        # "negative", any key then counts, and their scores stay finite: K rows past N load 0)
        row_lo = offs_m - LEFT
        row_span = tl.minimum(offs_m + RIGHT, N - 1) - row_lo
        for j in range(0, TRIPS):
            start_n = lo + j * BLOCK_N
            acc1, m1, l1, acc2, m2, l2 = _key_tile(
                start_n, qa, qb, qp, q2a, q2b, q2p, acc1, m1, l1, acc2, m2, l2, row_lo, row_span,
                k_ptr, k2_ptr, v_ptr, k_base, k2_base, v_base,
                stride_ks, stride_kd, stride_k2s, stride_k2d, stride_vs, stride_vd,
                kw_ptr, kb_ptr, ka_ptr, k_alpha, k_eps,
                cos_ptr, sin_ptr, cbase, sbase, stride_cs, stride_cw, stride_ss, stride_sw,
                qk_scale, N, D, R, HALF_PAD, PASS_PAD, BLOCK_N, DIFF,
                K_NORM, K_HAS_W, K_HAS_B, K_ALPHA_PTR, K_ROUND_PRE_W,
                ROPE, INTERLEAVED, TABLE_HALF, ACT, OFF64)

        # query rows past N have l = 0; they are not stored
        out = acc1 / tl.where(l1 == 0.0, 1.0, l1)[:, None]
        if DIFF:
            if LAM_PTR:
                lam_h = tl.load(lam_ptr + h * stride_lam).to(tl.float32)
            else:
                lam_h = lam
            out = out - lam_h * (acc2 / tl.where(l2 == 0.0, 1.0, l2)[:, None])
        dd = tl.arange(0, D)
        o_ptrs = _tile_ptrs(o_ptr, b * stride_ob + h * stride_oh, start_m, stride_os, stride_od, dd,
                            BLOCK_M, OFF64)
        tl.store(o_ptrs, _cast_out(out, o_ptr.dtype.element_ty), mask=qmask[:, None] & live)


class _Shim:
    """Stands in for ``_swa_fwd_kernel`` in ``ditfuse._attn_kernel``: a launch of the shipped
    kernel's grid (token-major: (B*H, query tiles)) becomes a persistent launch."""

    def __init__(self, programs, flatten):
        self.programs, self.flatten = programs, flatten

    def __getitem__(self, grid):
        def run(*args, **kw):
            N, H, left, right = args[21:25]
            bm, bn = kw["BLOCK_M"], kw["BLOCK_N"]
            assert kw["TOKEN_MAJOR"], "the persistent kernel orders tiles token-major"
            bh, n_m = grid
            P = min(bh * n_m, self.programs)
            trips = -(-(bm + left + right) // bn)
            return _swa_persistent_kernel[(P,)](*args, BH=bh, N_M=n_m, NUM_PROGRAMS=P,
                                                TRIPS=trips, ITERS=-(-bh * n_m // P),
                                                FLATTEN=self.flatten, OUTER_STAGES=1, **kw)
        return run


def run_persistent(p, settings, programs, flatten=True):
    import ditfuse._attn_kernel as K

    real = K._swa_fwd_kernel
    K._swa_fwd_kernel = _Shim(programs, flatten)
    try:
        return A.run(p, settings)
    finally:
        K._swa_fwd_kernel = real


def _case(N, w, diff, dt, device, B=1, H=24, D=64, seed=0):
    """A plan on views of a packed projection, as SAME passes them: (q1, q2, k1, k2, v) or
    (q, k, v)."""
    g = torch.Generator(device=device).manual_seed(seed)
    n_in = 5 if diff else 3
    proj = torch.randn(B, N, n_in * H * D, generator=g, device=device).to(dt)
    views = [t.unflatten(-1, (H, D)) for t in proj.chunk(n_in, dim=-1)]
    if diff:
        q1, q2, k1, k2, v = views
        return A.plan(q1, k1, v, w, q2=q2, k2=k2)
    q, k, v = views
    return A.plan(q, k, v, w)


def check():
    """CPU (interpreter): the persistent kernel gives the shipped kernel's bits."""
    for N, w, diff, B, H, programs in [(200, 17, True, 2, 3, 5), (77, (5, 30), True, 1, 2, 3),
                                       (150, 17, False, 1, 3, 4), (64, 0, True, 2, 1, 7)]:
        p = _case(N, w, diff, torch.bfloat16, "cpu", B=B, H=H)
        st = A.Settings(16, 16, 4, 1, True)
        ref = A.run(p, st)
        out = run_persistent(p, st, programs)
        print(N, w, diff, B, H, programs, "same bits" if torch.equal(out, ref) else
              f"DIFFERS max {(out.float() - ref.float()).abs().max().item():.3g}", flush=True)


def build():
    """sm_90 registers / spills / shared memory at SAME-L 8704 bf16 and fp32, table tiles."""
    from ditfuse import inspect_kernels as ik
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    for spec_name in ("same-l-bf16-attn", "same-l-fp32-attn"):
        spec = next(s for s in A.BUILD_SPECS if s.name == spec_name)
        grid, args, kw = A.capture_launch(spec)
        N, H, left, right = args[21:25]
        for flatten, cap in ((False, kw.get("maxnreg")), (True, kw.get("maxnreg")),
                             (False, None), (True, None)):
            bh, n_m = grid
            kw2 = dict(kw, TRIPS=-(-(kw["BLOCK_M"] + left + right) // kw["BLOCK_N"]),
                       FLATTEN=flatten, BH=bh, N_M=n_m, NUM_PROGRAMS=396,
                       ITERS=-(-bh * n_m // 396), maxnreg=cap, OUTER_STAGES=1)
            args2 = tuple(args)
            target = GPUTarget("cuda", 90, 32)
            try:
                sig, cex, attrs, opts = ik.specialize(_swa_persistent_kernel, args2, kw2, target)
                ck = triton.compile(ASTSource(_swa_persistent_kernel, sig, cex, attrs), target=target,
                                    options=opts.__dict__)
                pt = ik.run_ptxas(ck.asm["ptx"], opts, ck.metadata.name)
                print(spec_name, "flatten" if flatten else "nested", "cap", cap, "regs", pt["regs"], "spills",
                      pt["spill_stores"], pt["spill_loads"], "smem", ck.metadata.shared, flush=True)
            except Exception as e:  # noqa: BLE001
                print(spec_name, "flatten" if flatten else "nested", "FAILED", type(e).__name__,
                      str(e)[:300], flush=True)


def bench():
    """H200: CUDA-graph time of the table launch vs persistent (nested / flattened loops,
    2-4 programs a SM) at the SAME-L shapes."""
    from ditfuse.bench import copy_ceiling_gbps, graph_us
    from ditfuse.shapes import ATTN_SHAPES

    ceil = copy_ceiling_gbps()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for name, dt in (("same-l-8704", torch.bfloat16), ("same-l-32946", torch.bfloat16),
                     ("same-l-8704", torch.float32), ("same-l-trt", torch.float32)):
        sh = ATTN_SHAPES[name]
        p = _case(sh.N, sh.window, sh.differential, dt, "cuda", B=sh.B, H=sh.H, D=sh.D)
        nbytes = (6 if sh.differential else 4) * sh.B * sh.N * sh.H * sh.D * p.q.element_size()
        st = A.launch_settings(sh.D, dt, sh.window, sh.window, sh.N, sh.differential, False)
        st = A.Settings(*st[:4], True, *st[5:])
        ref = A.run(p, st)
        us = graph_us(lambda: A.run(p, st))
        print(f"{name:14s} {str(dt)[6:]:8s} table       {us:8.1f} us "
              f"{100 * nbytes / (us * 1e-6) / 1e9 / ceil:5.1f}% of floor", flush=True)
        for flatten in (False, True):
            for per_sm in (2, 3, 4):
                try:
                    out = run_persistent(p, st, per_sm * sms, flatten)
                    same = torch.equal(out, ref)
                    us = graph_us(lambda: run_persistent(p, st, per_sm * sms, flatten))
                except Exception as e:  # noqa: BLE001
                    print(f"{name} {dt} flatten={flatten} {per_sm}/SM: {type(e).__name__} "
                          f"{str(e)[:200]}", flush=True)
                    continue
                print(f"{name:14s} {str(dt)[6:]:8s} {'flat' if flatten else 'nest'} {per_sm}/SM "
                      f"{us:8.1f} us {100 * nbytes / (us * 1e-6) / 1e9 / ceil:5.1f}% of floor "
                      f"{'same bits' if same else 'DIFFERS'}", flush=True)


if __name__ == "__main__":
    if "--check" in sys.argv:
        check()
    elif "--build" in sys.argv:
        build()
    else:
        bench()
