"""GroupNorm's split path with TPA apply tiles a program, the next tile's loads pipelined
behind the current tile's arithmetic (session 21 experiment, after rms_pipe.py: two blocks a
program with three stages took the channel RMS from 179 to 174 us, the same bits).

The apply pass (one 8192-element tile a 4-warp program: merge the group's partials, load,
normalise, store) runs at ~90% of a copy's rate (session 7: 144 vs 131 us at
flux-vae-out-1024). Here a program merges its group's partials once and loops over TPA
consecutive tiles of the group with ``tl.range(num_stages=NS)``. The statistics launch is
the shipped one. Whole tiles only (every registry GroupNorm shape: BC = 1, BS = 8192).
bf16, CUDA graphs, L2 flushed before each replay; outputs checked bitwise against the
shipped call.

    PYTHONPATH=src python benchmarks/gn_apply_loop.py [shape ...]
"""
import sys

import torch
import triton
import triton.language as tl

import ditfuse
from ditfuse import group_norm as gn
from ditfuse.bench import graph_us
from ditfuse.shapes import GN_SHAPES


@triton.jit
def _apply_loop_kernel(x_ptr, y_ptr, w_ptr, b_ptr, part_ptr, G, cpg, S, n_ts, T, P, NGP, eps,
                       stride_xn, stride_xc, stride_xs, stride_yn, stride_yc, stride_ys,
                       BC: tl.constexpr, BS: tl.constexpr, P_PAD: tl.constexpr,
                       TPA: tl.constexpr, NS: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    t0 = pid * TPA
    ng = t0 // T
    n = ng // G
    g = ng - n * G
    mhi, corr, rstd, K = gn._merge_partials(part_ptr, ng, P, NGP, eps, P_PAD)
    ci = tl.arange(0, BC)[:, None]
    si = tl.arange(0, BS)[None, :]
    xo = gn._tile_offsets(ci, si, stride_xc, stride_xs, False)
    yo = gn._tile_offsets(ci, si, stride_yc, stride_ys, False)
    for i in tl.range(0, TPA, num_stages=NS):
        t = t0 - ng * T + i
        tc = t // n_ts
        ts = t - tc * n_ts
        c0 = g * cpg + tc * BC
        s0 = ts * BS
        x = gn._load_f32(x_ptr + (n * stride_xn + c0 * stride_xc + s0 * stride_xs) + xo, None,
                         True, "evict_first")
        w = gn._load_channels(w_ptr + c0, ci, 1, None, True, True, 1.0)
        b = gn._load_channels(b_ptr + c0, ci, 1, None, True, True, 0.0)
        y = (((x - K) - mhi) - corr) * (rstd * w)
        gn._gn_finish(y_ptr + (n * stride_yn + c0 * stride_yc + s0 * stride_ys), yo, None, y, b,
                      True, True, True, x_ptr.dtype.element_ty)


names = sys.argv[1:] or ["flux-vae-up1-256", "flux-vae-up2-512", "flux-vae-out-1024",
                         "hunyuan-vae-up-9f", "flux-vae-mid-128"]
for name in names:
    sh = GN_SHAPES[name]
    N, C = sh.shape[:2]
    G = sh.groups
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(sh.shape, generator=g, device="cuda") * 2 + 0.5).to(torch.bfloat16)
    w = (torch.randn((C,), generator=g, device="cuda") * 0.5 + 1).to(torch.bfloat16)
    b = (torch.randn((C,), generator=g, device="cuda") * 0.2).to(torch.bfloat16)
    ref = ditfuse.group_norm_silu(x, G, w, b, 1e-6)
    t_ship = graph_us(lambda: ditfuse.group_norm_silu(x, G, w, b, 1e-6))
    print(f"{name:20s} shipped          {t_ship:8.1f} us", flush=True)
    p = gn.plan_group_norm(x, G, w, b, 1e-6)
    S, cpg = p.S, C // G
    st = gn.gn_settings(N, G, cpg, S)
    assert st.path == "split" and cpg % st.BC == 0 and S % st.BS == 0 and st.P * st.TPP == st.T
    NG = N * G
    ngp = NG * st.P
    part = torch.empty(4 * ngp, dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    ys = gn._ncs(y, "out")[3]
    for tpa in (2, 4, 8):
        if st.T % tpa:
            continue
        for ns in (1, 2, 3, 4):
            def f():
                gn._gn_stats_kernel[(ngp,)](x, part, G, cpg, S, st.n_ts, st.T, st.P, ngp, *p.xs,
                                            BC=st.BC, BS=st.BS, TPP=st.TPP, OFF64=False, EVEN=True,
                                            num_warps=st.stats_warps)
                _apply_loop_kernel[(NG * st.T // tpa,)](
                    x, y, w, b, part, G, cpg, S, st.n_ts, st.T, st.P, ngp, 1e-6, *p.xs, *ys,
                    BC=st.BC, BS=st.BS, P_PAD=st.P_PAD, TPA=tpa, NS=ns, num_warps=st.num_warps)
            y.fill_(float("nan"))
            f()
            torch.cuda.synchronize()
            same = torch.equal(y, ref)
            print(f"{name:20s} tpa={tpa} ns={ns}      {graph_us(f):8.1f} us  bitwise {same}",
                  flush=True)
    print(f"{name:20s} shipped again    {graph_us(lambda: ditfuse.group_norm_silu(x, G, w, b, 1e-6)):8.1f} us",
          flush=True)
