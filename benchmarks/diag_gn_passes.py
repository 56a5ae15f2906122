"""Where the GroupNorm split path's time goes (session 6 diagnostic, H200): each pass of
``launch_group_norm`` timed alone (CUDA graph, L2 flushed), the apply pass with the group's
statistics already merged into one partial (P = 1) against the table's P partials, and a
plain copy of the same bytes. Prints us and GB/s of the pass's own bytes."""
import math
import sys

import torch

from ditfuse import group_norm as gn
from ditfuse.bench import graph_us
from ditfuse.shapes import GN_SHAPES

names = sys.argv[1:] or ["flux-vae-out-1024", "flux-vae-up2-512", "flux-vae-up1-256"]


def run(name):
    sh = GN_SHAPES[name]
    N, C = sh.shape[:2]
    S = math.prod(sh.shape[2:])
    G = sh.groups
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(sh.shape, generator=g, device="cuda") * 2 + 0.5).to(torch.bfloat16)
    w = (torch.randn(C, generator=g, device="cuda") * 0.5 + 1).to(torch.bfloat16)
    b = (torch.randn(C, generator=g, device="cuda") * 0.2).to(torch.bfloat16)
    y = torch.empty_like(x)
    p = gn.plan_group_norm(x, G, w, b, 1e-6)
    os_ = gn._ncs(y, "out")[3]
    nb = x.numel() * 2
    flags = dict(HAS_W=True, HAS_B=True, SILU=True, ROUND_NORM=True)

    def row(what, us, nbytes):
        print(f"{name:18s} {what:44s} {us:8.1f} us {nbytes / us / 1e3:7.0f} GB/s", flush=True)

    for label, kw in (("table", {}), ("one partial a group (P=1)", dict(max_partials=1)),
                      ("4096 stats programs", dict(stats_programs=4096))):
        st = gn.gn_settings(N, G, C // G, S, **kw)
        (part,) = gn._scratch(st, N * G, x.device)
        ngp = N * G * st.P
        even = (C // G) % st.BC == 0 and S % st.BS == 0 and gn.MASKLESS
        off = dict(OFF64=max(gn._tile_span(st, p.xs), gn._tile_span(st, os_)) >= gn.OFF32_LIMIT)

        def stats(st=st, part=part, ngp=ngp):
            gn._gn_stats_kernel[(ngp,)](x, part, G, C // G, S, st.n_ts, st.T, st.P, ngp, *p.xs,
                                        BC=st.BC, BS=st.BS, TPP=st.TPP, num_warps=st.stats_warps,
                                        **off, EVEN=even and st.P * st.TPP == st.T)

        def apply(st=st, part=part, ngp=ngp):
            gn._gn_apply_kernel[(N * G * st.T,)](
                x, y, w, b, part, G, C // G, S, st.n_ts, st.T, st.P, ngp, 1e-6, *p.xs, *os_,
                1, 1, BC=st.BC, BS=st.BS, P_PAD=st.P_PAD, **flags, num_warps=st.num_warps,
                **off, EVEN=even)

        stats()
        row(f"stats [{label}: P={st.P} TPP={st.TPP}]", graph_us(stats), nb)
        row(f"apply [{label}: P={st.P}]", graph_us(apply), 2 * nb)

        def both(stats=stats, apply=apply):
            stats()
            apply()
        row(f"stats + apply [{label}]", graph_us(both), 3 * nb)
    row("copy y <- x (torch)", graph_us(lambda: y.copy_(x)), 2 * nb)
    row("sum of x (torch, read only)", graph_us(lambda: x.sum(dtype=torch.float32)), nb)


for name in names:
    run(name)
    torch.cuda.empty_cache()
