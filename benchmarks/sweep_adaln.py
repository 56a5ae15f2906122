"""Launch-settings sweep for the AdaLN ops on the GPU: token rows per program x num_warps at
the registry's shapes (bf16), both ops, CUDA-graph device time (do_bench medians). Prints us
and % of the copy ceiling; informs adaln_settings()."""
import torch

import ditfuse
from ditfuse import adaln
from ditfuse.bench import _median_us, copy_ceiling_gbps
from ditfuse.shapes import ADALN_SHAPES
from ditfuse.workloads import adaln_inputs

ceil = copy_ceiling_gbps()
print(f"copy ceiling {ceil:.0f} GB/s")
base = adaln.adaln_settings


def _calls(s, per_op, n):
    def mod():
        return ditfuse.adaln_modulate(s["x"], s["shift"], s["scale"], eps=1e-6, rounding=per_op)

    def gated():
        return ditfuse.gated_residual_adaln(s["x"], s["y"], s["gate"], s["shift"], s["scale"], eps=1e-6,
                                            rounding=per_op)

    return (("modulate", 2 * n, mod), ("gated", 4 * n, gated))


for name, shape in ADALN_SHAPES.items():
    per_op = "per_op" if shape.model == "flux" else "once"
    s = adaln_inputs(shape, "cuda", torch.bfloat16, seed=0)
    n = shape.B * shape.S * shape.D * 2
    table = base(shape.B, shape.S, shape.D, shape.per_token)
    for op, nbytes, fn in _calls(s, per_op, n):
        res = []
        for rows in (1, 2, 4, 8):
            for nw in (4, 8, 16, 32):
                if nw * 32 > table[0] or (rows > 1 and shape.per_token):
                    continue
                adaln.adaln_settings = lambda *a, r=rows, w=nw, **k: (base(*a, **k)[0], base(*a, **k)[1], r, w)
                try:
                    fn()
                    torch.cuda.synchronize()
                    g = torch.cuda.CUDAGraph()  # device time: replayed, L2 flushed by do_bench
                    with torch.cuda.graph(g):
                        fn()
                    us = _median_us(g.replay)
                except Exception as e:  # noqa: BLE001
                    print(f"{name} {op} rows={rows} nw={nw}: {type(e).__name__} {e}")
                    continue
                finally:
                    adaln.adaln_settings = base
                pct = 100 * nbytes / (us * 1e-6) / 1e9 / ceil
                mark = " <- table" if (rows, nw) == (table[2], table[3]) else ""
                res.append((us, rows, nw, pct))
                print(f"{name:16s} {op:9s} rows={rows} nw={nw:2d} {us:8.1f} us {pct:6.1f}%{mark}", flush=True)
        best = min(res)
        print(f"BEST {name:16s} {op:9s} rows={best[1]} nw={best[2]} {best[0]:.1f} us {best[3]:.1f}%  "
              f"(table rows={table[2]} nw={table[3]})", flush=True)
    torch.cuda.empty_cache()
