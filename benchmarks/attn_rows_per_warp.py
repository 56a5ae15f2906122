"""Session 23 experiment: multi-warp fp32 band attention with each warp owning 16 query rows.

Why: Nsight Compute (``logs/s23/a``) puts the shipped fp32 entry (16-query one-warp programs)
at 78-85% of the L2's throughput: each program reads the 48 keys of K1 / K2 / V its 14 stored
queries need, 3.4 K / V rows a stored query. Programs of 32 / 64 rows on 2 / 4 warps read 2.1
/ 1.5, but session 18's 2-warp tile lost by 33%: Triton's mma.sync layout heuristic gives a
chain of dots the warps of the first dot it converts, and P @ V ([32, 64]: M < N) splits the
columns across warps ([1, 2]), so each softmax row reduction and P's operand layout cross
warps through shared memory. Here P @ V is two dots of 32 columns each ([BLOCK_M, 32]: M >= N
from BLOCK_M = 32), which gives every dot warps along the rows ([W, 1]).

Same arithmetic as the shipped kernel at SAME's case (differential, head_dim 64, no prologue,
window bounded on both sides, the query step); the two column halves of P @ V are the same
products and sums as one 64-column dot, so the output should be bitwise the shipped kernel's
at the same BLOCK_N.

    PYTHONPATH=src python benchmarks/attn_rows_per_warp.py [--build]     # GPU: times; --build: sm_90 resources (CPU)
"""
import sys

import torch
import triton
import triton.language as tl

from ditfuse._attn_kernel import _dot_operand, _softmax_step


@triton.jit
def _band_diff_rows_kernel(q_ptr, q2_ptr, k_ptr, k2_ptr, v_ptr, o_ptr, lam, qk_scale,
                           N, H, LEFT, RIGHT, stride_s_q, stride_s_k, stride_s_v, stride_s_o,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STEP_M: tl.constexpr,
                           SPLIT: tl.constexpr):
    ACT: tl.constexpr = q_ptr.dtype.element_ty
    bh = tl.program_id(0)
    start_m = tl.program_id(1) * STEP_M
    h = bh % H  # B = 1 here; unit head-dim stride, head stride 64
    offs_m = start_m + tl.arange(0, BLOCK_M)
    qmask = offs_m < N
    dd = tl.arange(0, 64)
    hd = tl.arange(0, 32)
    qo = offs_m.to(tl.int64)[:, None] * stride_s_q + h * 64 + dd[None, :]
    qa = _dot_operand(tl.load(q_ptr + qo, mask=qmask[:, None], other=0.0), ACT)
    q2a = _dot_operand(tl.load(q2_ptr + qo, mask=qmask[:, None], other=0.0), ACT)
    m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l1 = tl.zeros([BLOCK_M], tl.float32)
    m2 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l2 = tl.zeros([BLOCK_M], tl.float32)
    if SPLIT:
        a1l = tl.zeros([BLOCK_M, 32], tl.float32)
        a1h = tl.zeros([BLOCK_M, 32], tl.float32)
        a2l = tl.zeros([BLOCK_M, 32], tl.float32)
        a2h = tl.zeros([BLOCK_M, 32], tl.float32)
    else:
        a1 = tl.zeros([BLOCK_M, 64], tl.float32)
        a2 = tl.zeros([BLOCK_M, 64], tl.float32)
    lo = tl.maximum(start_m - LEFT, 0)
    hi = tl.minimum(start_m + STEP_M + RIGHT, N)
    row_lo = offs_m - LEFT
    row_span = tl.minimum(offs_m + RIGHT, N - 1) - row_lo
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kmask = offs_n < N
        band = (offs_n[None, :] - row_lo[:, None]).to(tl.uint32, bitcast=True) <= \
            row_span[:, None].to(tl.uint32, bitcast=True)
        ko = offs_n.to(tl.int64)[:, None] * stride_s_k + h * 64 + dd[None, :]
        ka = _dot_operand(tl.load(k_ptr + ko, mask=kmask[:, None], other=0.0), ACT)
        s1 = tl.dot(qa, tl.trans(ka), input_precision="tf32")
        p1, al1, m1, l1 = _softmax_step(s1, band, m1, l1, qk_scale)
        k2a = _dot_operand(tl.load(k2_ptr + ko, mask=kmask[:, None], other=0.0), ACT)
        s2 = tl.dot(q2a, tl.trans(k2a), input_precision="tf32")
        p2, al2, m2, l2 = _softmax_step(s2, band, m2, l2, qk_scale)
        vo = offs_n.to(tl.int64)[:, None] * stride_s_v + h * 64
        if SPLIT:
            vl = _dot_operand(tl.load(v_ptr + vo + hd[None, :], mask=kmask[:, None], other=0.0), ACT)
            vh = _dot_operand(tl.load(v_ptr + vo + 32 + hd[None, :], mask=kmask[:, None], other=0.0), ACT)
            pp1 = _dot_operand(p1, ACT)
            pp2 = _dot_operand(p2, ACT)
            a1l = a1l * al1[:, None] + tl.dot(pp1, vl, input_precision="tf32")
            a1h = a1h * al1[:, None] + tl.dot(pp1, vh, input_precision="tf32")
            a2l = a2l * al2[:, None] + tl.dot(pp2, vl, input_precision="tf32")
            a2h = a2h * al2[:, None] + tl.dot(pp2, vh, input_precision="tf32")
        else:
            v = _dot_operand(tl.load(v_ptr + vo + dd[None, :], mask=kmask[:, None], other=0.0), ACT)
            a1 = a1 * al1[:, None] + tl.dot(_dot_operand(p1, ACT), v, input_precision="tf32")
            a2 = a2 * al2[:, None] + tl.dot(_dot_operand(p2, ACT), v, input_precision="tf32")
    i1 = 1.0 / tl.where(l1 == 0.0, 1.0, l1)
    i2 = lam / tl.where(l2 == 0.0, 1.0, l2)
    smask = qmask & (tl.arange(0, BLOCK_M) < STEP_M)
    oo = offs_m.to(tl.int64)[:, None] * stride_s_o + h * 64
    if SPLIT:
        tl.store(o_ptr + oo + hd[None, :], (a1l * i1[:, None] - a2l * i2[:, None]).to(o_ptr.dtype.element_ty),
                 mask=smask[:, None])
        tl.store(o_ptr + oo + 32 + hd[None, :], (a1h * i1[:, None] - a2h * i2[:, None]).to(o_ptr.dtype.element_ty),
                 mask=smask[:, None])
    else:
        tl.store(o_ptr + oo + dd[None, :], (a1 * i1[:, None] - a2 * i2[:, None]).to(o_ptr.dtype.element_ty),
                 mask=smask[:, None])


def launch(q1, q2, k1, k2, v, out, window, cfg):
    bm, bn, warps, stages, step, split, cap = cfg
    B, N, H, D = q1.shape
    assert B == 1 and D == 64
    for t in (q1, q2, k1, k2, v, out):
        assert t.stride(3) == 1 and t.stride(2) == 64
    grid = (H, triton.cdiv(N, step))
    kw = dict(num_warps=warps, num_stages=stages)
    if cap:
        kw["maxnreg"] = cap
    _band_diff_rows_kernel[grid](q1, q2, k1, k2, v, out, 1.0, D ** -0.5 * 1.4426950408889634,
                                 N, H, window, window, q1.stride(1), k1.stride(1), v.stride(1),
                                 out.stride(1), BLOCK_M=bm, BLOCK_N=bn, STEP_M=step, SPLIT=split,
                                 **kw)
    return out


# (BLOCK_M, BLOCK_N, warps, stages, step, split, maxnreg)
CONFIGS = [(16, 16, 1, 2, 14, False, 224), (32, 16, 2, 2, 30, True, None),
           (32, 16, 2, 3, 30, True, None), (32, 16, 2, 2, 30, True, 168),
           (64, 16, 4, 2, 62, True, None), (64, 16, 4, 3, 62, True, None),
           (64, 32, 4, 2, 62, True, None), (32, 16, 2, 2, 30, False, None)]


def build():
    """sm_90 builds on the CPU: registers, spills, the mma layout's warps."""
    import re
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    sig = {n: "*fp32" for n in ("q_ptr", "q2_ptr", "k_ptr", "k2_ptr", "v_ptr", "o_ptr")}
    sig.update({n: "fp32" for n in ("lam", "qk_scale")})
    sig.update({n: "i32" for n in ("N", "H", "LEFT", "RIGHT", "stride_s_q", "stride_s_k",
                                   "stride_s_v", "stride_s_o")})
    from ditfuse import inspect_kernels as ik
    for bm, bn, warps, stages, step, split, cap in CONFIGS:
        cst = dict(BLOCK_M=bm, BLOCK_N=bn, STEP_M=step, SPLIT=split)
        s = dict(sig, **{k: "constexpr" for k in cst})
        opts = dict(num_warps=warps, num_stages=stages, enable_fp_fusion=False)
        if cap:
            opts["maxnreg"] = cap
        ck = triton.compile(ASTSource(_band_diff_rows_kernel, s, cst), target=GPUTarget("cuda", 90, 32),
                            options=opts)
        mma = re.findall(r"#mma\d* = #ttg.nvidia_mma<\{[^}]*warpsPerCTA = \[(\d+), (\d+)\]", ck.asm["ttgir"])
        pt = ik.run_ptxas(ck.asm["ptx"], ck.metadata, ck.metadata.name)
        sass = ik.run_cuobjdump(ck.asm["cubin"], ck.metadata.name)
        print(f"{(bm, bn, warps, stages, step, split, cap)}: regs {pt['regs']} spills "
              f"{pt['spill_stores']}/{pt['spill_loads']} loop-local {sass['loop_local']} "
              f"smem {ck.metadata.shared} mma warps {mma}", flush=True)


def main():
    if "--build" in sys.argv:
        return build()
    from ditfuse import attention as A
    from ditfuse.bench import copy_ceiling_gbps, graph_us
    ceil = copy_ceiling_gbps()
    for name, N in (("same-l-trt", 4352), ("same-l-8704", 8704), ("same-l-32946", 32946)):
        H, D, w = 24, 64, 17
        g = torch.Generator(device="cuda").manual_seed(0)
        proj = torch.randn(1, N, 5 * H * D, generator=g, device="cuda")
        q1, q2, k1, k2, v = [t.unflatten(-1, (H, D)) for t in proj.chunk(5, dim=-1)]
        nbytes = 6 * N * H * D * 4
        ref = A.sliding_window_attention(q1, k1, v, w, q2=q2, k2=k2)
        t_ref = graph_us(lambda: A.sliding_window_attention(q1, k1, v, w, q2=q2, k2=k2))
        print(f"{name} fp32 shipped {t_ref:7.1f} us {100 * nbytes / t_ref / 1e3 / ceil:5.1f}% of floor", flush=True)
        for cfg in CONFIGS:
            out = torch.full_like(ref, float("nan"))
            try:
                launch(q1, q2, k1, k2, v, out, w, cfg)
                d = (out - ref).abs().max().item()
                t = graph_us(lambda cfg=cfg, out=out: launch(q1, q2, k1, k2, v, out, w, cfg))
            except Exception as e:  # noqa: BLE001
                print(f"{name} {cfg}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                continue
            print(f"{name} fp32 {cfg} {t:7.1f} us {100 * nbytes / t / 1e3 / ceil:5.1f}% of floor "
                  f"max|d| vs shipped {d:.2g}", flush=True)


if __name__ == "__main__":
    main()
