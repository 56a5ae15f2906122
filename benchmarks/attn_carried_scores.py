"""Session 25 experiment: band attention (differential, bf16/fp16, head_dim 64, no
prologue, (B, N, H, D) views) with the next key tile's score products issued one trip
early and carried into the next trip, so that Triton's wgmma pipelining may leave them in
flight (wait deferred) while this trip's softmax runs -- the intra-warpgroup overlap of
FlashAttention-3 -- instead of waiting on each score product right after issuing it (the
shipped kernel: ``wgmma.wait_group 0`` after each of the two score products).

Same tiles, band, step and arithmetic as the shipped kernel at SAME-L's bf16 entry (64
queries, 62 stored, 32-key tiles from the tile's first key, 4 warps, 3 stages, cap 168):
the output bits should equal ``ditfuse.sliding_window_attention``'s.

    PYTHONPATH=src python benchmarks/attn_carried_scores.py            # GPU: check + time
    TRITON_INTERPRET=0 PYTHONPATH=src python benchmarks/attn_carried_scores.py --build
"""
import sys

import torch
import triton
import triton.backends.nvidia.compiler  # noqa: F401
import triton.language as tl

from ditfuse._kernel_utils import _cast_out, _ex2

LOG2E = 1.4426950408889634


@triton.jit
def _tile(ptr, base, start, stride_s, N, BLOCK: tl.constexpr, D: tl.constexpr):
    r = start + tl.arange(0, BLOCK)
    d = tl.arange(0, D)
    p = ptr + base + r.to(tl.int64)[:, None] * stride_s + d[None, :]
    return tl.load(p, mask=(r < N)[:, None], other=0.0)


@triton.jit
def _step(s, band, m_i, l_i, qk_scale):
    s = tl.where(band, s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = _ex2(m_i - m_use)
    p = _ex2(s - m_use[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _carried_kernel(q_ptr, k_ptr, v_ptr, q2_ptr, k2_ptr, o_ptr, lam, qk_scale, N, H, LEFT, RIGHT,
                    stride_b, stride_s, stride_h, stride_ob, stride_os, stride_oh,
                    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    STEP_M: tl.constexpr):
    bh = tl.program_id(0)
    start_m = tl.program_id(1) * STEP_M
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    base = b * stride_b + h * stride_h
    q1 = _tile(q_ptr, base, start_m, stride_s, N, BLOCK_M, D)
    q2 = _tile(q2_ptr, base, start_m, stride_s, N, BLOCK_M, D)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    row_lo = offs_m - LEFT
    row_span = tl.minimum(offs_m + RIGHT, N - 1) - row_lo
    lo = tl.maximum(start_m - LEFT, 0)
    hi = tl.minimum(start_m + STEP_M + RIGHT, N)
    m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    m2 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l1 = tl.zeros([BLOCK_M], tl.float32)
    l2 = tl.zeros([BLOCK_M], tl.float32)
    acc1 = tl.zeros([BLOCK_M, D], tl.float32)
    acc2 = tl.zeros([BLOCK_M, D], tl.float32)
    # the first tile's scores before the loop; each trip issues the next tile's
    s1 = tl.dot(q1, tl.trans(_tile(k_ptr, base, lo, stride_s, N, BLOCK_N, D)))
    s2 = tl.dot(q2, tl.trans(_tile(k2_ptr, base, lo, stride_s, N, BLOCK_N, D)))
    for start_n in range(lo, hi, BLOCK_N):
        nxt = start_n + BLOCK_N  # past hi on the last trip: loaded (masked past N), unused
        s1n = tl.dot(q1, tl.trans(_tile(k_ptr, base, nxt, stride_s, N, BLOCK_N, D)))
        s2n = tl.dot(q2, tl.trans(_tile(k2_ptr, base, nxt, stride_s, N, BLOCK_N, D)))
        offs_n = start_n + tl.arange(0, BLOCK_N)
        band = (offs_n[None, :] - row_lo[:, None]).to(tl.uint32, bitcast=True) <= \
            row_span[:, None].to(tl.uint32, bitcast=True)
        p1, a1, m1, l1 = _step(s1, band, m1, l1, qk_scale)
        p2, a2, m2, l2 = _step(s2, band, m2, l2, qk_scale)
        v = _tile(v_ptr, base, start_n, stride_s, N, BLOCK_N, D)
        acc1 = acc1 * a1[:, None] + tl.dot(p1.to(v.dtype), v)
        acc2 = acc2 * a2[:, None] + tl.dot(p2.to(v.dtype), v)
        s1 = s1n
        s2 = s2n
    r1 = 1.0 / tl.where(l1 == 0.0, 1.0, l1)
    c2 = lam * (1.0 / tl.where(l2 == 0.0, 1.0, l2))
    out = tl.fma(acc2, -c2[:, None], acc1 * r1[:, None])
    smask = (offs_m < N) & (tl.arange(0, BLOCK_M) < STEP_M)
    o = o_ptr + b * stride_ob + h * stride_oh + offs_m.to(tl.int64)[:, None] * stride_os + \
        tl.arange(0, D)[None, :]
    tl.store(o, _cast_out(out, o_ptr.dtype.element_ty), mask=smask[:, None])


def call(q1, k1, v, q2, k2, window, lam=1.0, stages=3, maxnreg=168):
    B, N, H, D = q1.shape
    out = torch.empty(B, N, H, D, dtype=q1.dtype, device=q1.device)
    grid = (B * H, triton.cdiv(N, 62))
    for t in (q1, k1, v, q2, k2):
        assert t.stride() == q1.stride() and t.stride(3) == 1
    kw = {"maxnreg": maxnreg} if maxnreg else {}
    _carried_kernel[grid](q1, k1, v, q2, k2, out, lam, D ** -0.5 * LOG2E, N, H, window, window,
                          q1.stride(0), q1.stride(1), q1.stride(2),
                          out.stride(0), out.stride(1), out.stride(2),
                          D=D, BLOCK_M=64, BLOCK_N=32, STEP_M=62, num_warps=4,
                          num_stages=stages, enable_fp_fusion=False, **kw)
    return out


def build():
    """sm_90 build on the CPU: registers, spills, the wgmma waits' positions."""
    import re

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ditfuse import inspect_kernels as ik
    sig = {n: "*bf16" for n in ("q_ptr", "k_ptr", "v_ptr", "q2_ptr", "k2_ptr", "o_ptr")}
    sig.update({n: "fp32" for n in ("lam", "qk_scale")})
    sig.update({n: "i32" for n in ("N", "H", "LEFT", "RIGHT", "stride_b", "stride_s", "stride_h",
                                   "stride_ob", "stride_os", "stride_oh")})
    const = dict(D=64, BLOCK_M=64, BLOCK_N=32, STEP_M=62)
    sig.update({k: "constexpr" for k in const})
    for stages in (2, 3):
        for cap in (None, 168):
            opts = dict(num_warps=4, num_stages=stages, enable_fp_fusion=False)
            if cap:
                opts["maxnreg"] = cap
            ck = triton.compile(ASTSource(_carried_kernel, sig, const),
                                target=GPUTarget("cuda", 90, 32), options=opts)
            ptx = ck.asm["ptx"]
            pt = ik.run_ptxas(ptx, triton.backends.nvidia.compiler.CUDAOptions(**opts),
                              ck.metadata.name)
            waits = re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx)
            sass = ik.run_cuobjdump(ck.asm["cubin"], ck.metadata.name)
            print(f"stages {stages} cap {cap}: regs {pt['regs']} spills {pt['spill_stores']} smem "
                  f"{ck.metadata.shared} sass {sass['sass_instructions']} waits {waits}", flush=True)


def main():
    if "--build" in sys.argv:
        return build()
    import ditfuse
    from ditfuse.bench import graph_us
    for N, dt in ((8704, torch.bfloat16), (32946, torch.bfloat16), (4352, torch.bfloat16)):
        g = torch.Generator(device="cuda").manual_seed(0)
        proj = torch.randn(1, N, 5 * 24 * 64, generator=g, device="cuda").to(dt)
        q1, q2, k1, k2, v = [t.unflatten(-1, (24, 64)) for t in proj.chunk(5, dim=-1)]
        want = ditfuse.sliding_window_attention(q1, k1, v, 17, q2=q2, k2=k2)
        t_ship = graph_us(lambda: ditfuse.sliding_window_attention(q1, k1, v, 17, q2=q2, k2=k2))
        for stages in (2, 3):
            for cap in (168, None):
                got = call(q1, k1, v, q2, k2, 17, stages=stages, maxnreg=cap)
                d = (got.float() - want.float()).abs().max().item()
                t = graph_us(lambda: call(q1, k1, v, q2, k2, 17, stages=stages, maxnreg=cap))
                print(f"N {N:5d} {str(dt)[6:]} shipped {t_ship:7.1f} us | carried stages {stages} "
                      f"cap {cap}: {t:7.1f} us, max|d| vs shipped {d:.3g}", flush=True)


if __name__ == "__main__":
    main()
