"""Experiment (session 17): the SAME-L band attention (head_dim 64, differential, no prologue,
batch 1) with Q / K / V tiles loaded by TMA (host tensor descriptors over the (N, H*D) rows of
the packed projection's chunks) instead of pointer loads, optionally with Triton's Hopper
warp specialization of the key loop (``tl.range(..., warp_specialize=True)``: a producer warp
issuing the TMA loads, the softmax warpgroup consuming them). The shipped kernel's pointer
loads compute every element's address in registers (167 of its 168-register cap at SAME-L
bf16); TMA takes a tile's coordinates only.

    TRITON_INTERPRET=0 PYTHONPATH=src python benchmarks/attn_tma.py --build   # sm_90 builds, CPU
    PYTHONPATH=src python benchmarks/attn_tma.py                              # H200: A/B, us

Same arithmetic as ``_attn_kernel`` (scores scaled in the band select, ex2, probabilities
rounded to the input dtype before P @ V, fp32 sums), so the output is compared with the
shipped kernel's.
"""
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ditfuse._kernel_utils import _ex2


@triton.jit
def _softmax(s, band, m_i, l_i, qk_scale):
    s = tl.where(band, s * qk_scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = _ex2(m_i - m_use)
    p = _ex2(s - m_use[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _swa_tma_kernel(q_desc, k_desc, v_desc, q2_desc, k2_desc, o_ptr, lam, qk_scale, N, H, LEFT,
                    RIGHT, stride_os, stride_oh,
                    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    DIFF: tl.constexpr, WS: tl.constexpr, STAGES: tl.constexpr):
    ACT: tl.constexpr = q_desc.dtype
    h = tl.program_id(0)
    start_m = tl.program_id(1) * BLOCK_M
    col = h * D
    q1 = q_desc.load([start_m, col])
    offs_m = start_m + tl.arange(0, BLOCK_M)
    m1 = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l1 = tl.zeros([BLOCK_M], tl.float32)
    acc1 = tl.zeros([BLOCK_M, D], tl.float32)
    if DIFF:
        q2 = q2_desc.load([start_m, col])
        m2 = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l2 = tl.zeros([BLOCK_M], tl.float32)
        acc2 = tl.zeros([BLOCK_M, D], tl.float32)
    lo = tl.maximum(start_m - LEFT, 0)
    hi = tl.minimum(start_m + BLOCK_M + RIGHT, N)
    row_lo = offs_m - LEFT
    row_span = tl.minimum(offs_m + RIGHT, N - 1) - row_lo
    for start_n in tl.range(lo, hi, BLOCK_N, num_stages=STAGES, warp_specialize=WS):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        band = (offs_n[None, :] - row_lo[:, None]).to(tl.uint32, bitcast=True) <= \
            row_span[:, None].to(tl.uint32, bitcast=True)
        k1 = k_desc.load([start_n, col])
        p1, a1, m1, l1 = _softmax(tl.dot(q1, tl.trans(k1), input_precision="tf32"), band, m1,
                                  l1, qk_scale)
        if DIFF:
            k2 = k2_desc.load([start_n, col])
            p2, a2, m2, l2 = _softmax(tl.dot(q2, tl.trans(k2), input_precision="tf32"), band,
                                      m2, l2, qk_scale)
        v = v_desc.load([start_n, col])
        acc1 = acc1 * a1[:, None] + tl.dot(p1.to(ACT), v, input_precision="tf32")
        if DIFF:
            acc2 = acc2 * a2[:, None] + tl.dot(p2.to(ACT), v, input_precision="tf32")
    out = acc1 / tl.where(l1 == 0.0, 1.0, l1)[:, None]
    if DIFF:
        out = out - lam * (acc2 / tl.where(l2 == 0.0, 1.0, l2)[:, None])
    dd = tl.arange(0, D)
    ptrs = o_ptr + offs_m[:, None].to(tl.int64) * stride_os + h * stride_oh + dd[None, :]
    tl.store(ptrs, out.to(o_ptr.dtype.element_ty), mask=(offs_m < N)[:, None])


def launch(q, k, v, window, q2=None, k2=None, lam=1.0, cfg=(64, 32, 4, 3, False)):
    """q, k, v (1, N, H, D) views with unit channel stride; returns (1, N, H, D)."""
    BM, BN, nw, st, ws = cfg
    _, N, H, D = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)

    def desc(t, rows):
        t2 = t[0].flatten(1)  # (N, H*D) rows of the chunk: strides (token, 1)
        return TensorDescriptor(t2, list(t2.shape), list(t2.stride()), [rows, D])

    diff = q2 is not None
    qd, kd, vd = desc(q, BM), desc(k, BN), desc(v, BN)
    q2d, k2d = (desc(q2, BM), desc(k2, BN)) if diff else (qd, kd)
    grid = (H, triton.cdiv(N, BM))
    _swa_tma_kernel[grid](qd, kd, vd, q2d, k2d, out, lam, D ** -0.5 * 1.4426950408889634, N, H,
                          window, window, out.stride(1), out.stride(2), D=D, BLOCK_M=BM,
                          BLOCK_N=BN, DIFF=diff, WS=ws, STAGES=st, num_warps=nw, num_stages=st)
    return out


CONFIGS = [(64, 32, 4, 3, False), (64, 32, 4, 2, False), (64, 16, 4, 3, False),
           (64, 32, 4, 3, True), (64, 32, 4, 2, True), (128, 32, 8, 2, True)]


def build():
    """sm_90 builds on the CPU (meta tensors): registers, spills, SASS size, or the error."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ditfuse import _runtime
    from ditfuse import inspect_kernels as ik

    N, H, D = 8704, 24, 64
    for dt in (torch.bfloat16, torch.float32):
        proj = torch.empty(1, N, 5 * H * D, dtype=dt, device="meta")
        q1, q2, k1, k2, v = [t.unflatten(-1, (H, D)) for t in proj.chunk(5, dim=-1)]
        for cfg in CONFIGS:
            calls = []

            class Stub:
                def __getitem__(self, grid):
                    return lambda *a, **kw: calls.append((a, kw))

            g = globals()
            real = g["_swa_tma_kernel"]
            g["_swa_tma_kernel"] = Stub()
            ok = _runtime.kernel_device_ok
            try:
                launch(q1, k1, v, 17, q2=q2, k2=k2, cfg=cfg)
            finally:
                g["_swa_tma_kernel"] = real
                _runtime.kernel_device_ok = ok
            args, kw = calls[0]
            target = GPUTarget("cuda", ik.ARCH, ik.WARP_SIZE)
            try:
                sig, cex, attrs, opts = ik.specialize(real, args, kw, target)
                ck = triton.compile(ASTSource(real, sig, cex, attrs), target=target,
                                    options=opts.__dict__)
                p = ik.run_ptxas(ck.asm["ptx"], opts, ck.metadata.name)
                sass = ik.run_cuobjdump(ck.asm["cubin"], ck.metadata.name)
                print(f"{str(dt)[6:]:9s} {cfg}: {p['regs']} registers, spill {p['spill_stores']}, "
                      f"smem {ck.metadata.shared}, warps {ck.metadata.num_warps}, "
                      f"sass {sass.get('sass_instructions')}", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"{str(dt)[6:]:9s} {cfg}: {type(e).__name__}: {str(e).splitlines()[0][:160]}",
                      flush=True)


def main():
    from ditfuse import attention as A
    from ditfuse.bench import copy_ceiling_gbps, graph_us
    from ditfuse.shapes import ATTN_SHAPES

    ceil = copy_ceiling_gbps()
    print(f"copy ceiling {ceil:.0f} GB/s", flush=True)
    for name, dt in (("same-l-8704", torch.bfloat16), ("same-l-32946", torch.bfloat16),
                     ("same-l-trt", torch.float32), ("same-l-8704", torch.float32)):
        sh = ATTN_SHAPES[name]
        g = torch.Generator(device="cuda").manual_seed(0)
        proj = torch.randn(sh.B, sh.N, 5 * sh.H * sh.D, generator=g, device="cuda").to(dt)
        q1, q2, k1, k2, v = [t.unflatten(-1, (sh.H, sh.D)) for t in proj.chunk(5, dim=-1)]
        p = A.plan(q1, k1, v, sh.window, q2=q2, k2=k2)
        ref = A.run(p)
        nbytes = 6 * sh.B * sh.N * sh.H * sh.D * proj.element_size()
        us = graph_us(lambda: A.run(p))
        print(f"{name:13s} {str(dt)[6:]:9s} shipped {us:7.1f} us {100 * nbytes / us / 1e3 / ceil:5.1f}%",
              flush=True)
        for cfg in CONFIGS:
            try:
                out = launch(q1, k1, v, sh.window, q2=q2, k2=k2, cfg=cfg)
                torch.cuda.synchronize()
                err = (out.float() - ref.float()).abs().max().item()
                us = graph_us(lambda cfg=cfg: launch(q1, k1, v, sh.window, q2=q2, k2=k2, cfg=cfg))
            except Exception as e:  # noqa: BLE001
                print(f"{name:13s} {cfg}: {type(e).__name__}: {str(e)[:160]}", flush=True)
                continue
            print(f"{name:13s} {str(dt)[6:]:9s} tma {cfg} {us:7.1f} us "
                  f"{100 * nbytes / us / 1e3 / ceil:5.1f}%  max|d| vs shipped {err:.3g}", flush=True)


if __name__ == "__main__":
    build() if "--build" in sys.argv else main()
