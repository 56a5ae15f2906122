"""The channel RMS with several position blocks a program, the next block's loads
pipelined behind the current block's arithmetic (session 21 experiment).

rms_variants.py found the in-register column kernel faster with more, smaller programs an SM
(5 -> 6 programs of 4 warps: 196 -> 179 us at wan-vae-out-480p bf16) and slower with larger
ones (8 warps a program: 283 us): a program's phases -- every load, the cross-warp sum, the
arithmetic, the stores -- do not overlap within it. Here each program loops over ITERS
blocks of BS positions (blocks pid, pid + grid, ...) with ``tl.range(num_stages=NS)``, so
Triton may prefetch block i + 1 (cp.async into shared memory) while block i is computed.
Same arithmetic as the shipped kernel (``_rms_finish``); outputs checked bitwise against it.

    PYTHONPATH=src python benchmarks/rms_pipe.py
"""
import torch
import triton
import triton.language as tl

import ditfuse
from ditfuse import group_norm as gn
from ditfuse.bench import graph_us
from ditfuse.shapes import GN_SHAPES


@triton.jit
def _rms_loop_kernel(x_ptr, y_ptr, g_ptr, b_ptr, S, n_blocks, eps, scale, stride_c,
                     BC: tl.constexpr, BC1: tl.constexpr, BS: tl.constexpr,
                     ITERS: tl.constexpr, NS: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    c0 = tl.arange(0, BC)[:, None]
    c1 = BC + tl.arange(0, BC1)[:, None]
    si = tl.arange(0, BS)[None, :]
    xo = c0 * stride_c + si
    xo1 = c1 * stride_c + si
    gm = tl.load(g_ptr + c0).to(tl.float32)
    b = tl.load(b_ptr + c0).to(tl.float32)
    gm1 = tl.load(g_ptr + c1).to(tl.float32)
    b1 = tl.load(b_ptr + c1).to(tl.float32)
    ACT: tl.constexpr = x_ptr.dtype.element_ty
    for it in tl.range(0, ITERS, num_stages=NS):
        blk = pid + it * nprog
        base = (blk.to(tl.int64) * BS)
        m = None  # the grid divides the blocks exactly (checked on the host)
        x = tl.load(x_ptr + base + xo).to(tl.float32)
        x1 = tl.load(x_ptr + base + xo1).to(tl.float32)
        sq = tl.sum(tl.reshape(x * x, (BC // BC1, BC1, BS)), 0) + x1 * x1
        inv = 1.0 / tl.maximum(tl.sqrt_rn(tl.sum(sq, 0)[None, :]), eps)
        gn._rms_finish(y_ptr + base, xo, m, x, inv, gm, b, scale, True, True, True, True, ACT)
        gn._rms_finish(y_ptr + base, xo1, m, x1, inv, gm1, b1, scale, True, True, True, True, ACT)


sh = GN_SHAPES["wan-vae-out-480p"]
N, C = sh.shape[:2]
S = 1
for d in sh.shape[2:]:
    S *= d
g = torch.Generator(device="cuda").manual_seed(0)
x = (torch.randn(sh.shape, generator=g, device="cuda") * 2 + 0.5).to(torch.bfloat16)
ps = (C,) + (1,) * (len(sh.shape) - 2)
w = (torch.randn(ps, generator=g, device="cuda") * 0.5 + 1).to(torch.bfloat16)
bias = (torch.randn(ps, generator=g, device="cuda") * 0.2).to(torch.bfloat16)
ref = ditfuse.rms_norm_silu_channels(x, w, bias)
print(f"shipped {graph_us(lambda: ditfuse.rms_norm_silu_channels(x, w, bias)):8.1f} us", flush=True)
y = torch.empty_like(x)
wv, bv = w.view(C), bias.view(C)
scale = float(C) ** 0.5
for BS in (64, 128):
    nb = S // BS
    for iters in (2, 4, 8):
        for ns in (1, 2, 3):
            for W in ((4,) if BS == 64 else (4, 8)):
                for cap in ((None, 80) if W == 8 or BS == 64 else (None, 128)):
                    assert nb % iters == 0
                    grid = (nb // iters,)
                    kw = dict(BC=64, BC1=32, BS=BS, ITERS=iters, NS=ns, num_warps=W,
                              enable_fp_fusion=False, **({"maxnreg": cap} if cap else {}))

                    def f():
                        _rms_loop_kernel[grid](x, y, wv, bv, S, nb, 1e-12, scale, S, **kw)
                    y.fill_(float("nan"))
                    try:
                        f()
                        torch.cuda.synchronize()
                    except Exception as e:  # noqa: BLE001
                        print(f"BS={BS} iters={iters} ns={ns} W={W} cap={cap}: "
                              f"{type(e).__name__}: {e}"[:200], flush=True)
                        continue
                    print(f"BS={BS:<3d} iters={iters} ns={ns} W={W} cap={str(cap):4s} "
                          f"{graph_us(f):8.1f} us  bitwise {torch.equal(y, ref)}", flush=True)
print(f"shipped again {graph_us(lambda: ditfuse.rms_norm_silu_channels(x, w, bias)):8.1f} us")
