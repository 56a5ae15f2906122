"""Sweep of the AdaLN tile kernel's launch settings on the GPU: the table
(``adaln.tile_settings``) against other (rows, num_warps) (``adaln.TILE_SETTINGS``) at the
registry's shapes, bf16 (--dtype=fp16|fp32), both ops, CUDA-graph replay with L2 flushed by do_bench. Prints
us, % of the copy ceiling and the largest |difference| from the table's output."""
import dataclasses
import sys

import torch

import ditfuse
from ditfuse import adaln
from ditfuse.bench import copy_ceiling_gbps, graph_us
from ditfuse.shapes import ADALN_SHAPES
from ditfuse.workloads import adaln_inputs

# None: the table (adaln.tile_settings); argv: "rows,warps rows,warps ..." to sweep others,
# --shapes=flux1-1024,flux2-1024 to take some of the registry's shapes (``flux2-1024+S=16896``:
# a registry shape with another token count)
ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
    next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--dtype=")), "bf16")]
SHAPES = next((a.split("=", 1)[1].split(",") for a in sys.argv[1:] if a.startswith("--shapes=")),
              list(ADALN_SHAPES))
CONFIGS = [None] + ([tuple(int(v) for v in a.split(",")) for a in ARGS] or
                    [(1, 2), (1, 4), (1, 8), (2, 2), (2, 4), (4, 4)])


def _calls(s, per_op):
    def mod():
        return ditfuse.adaln_modulate(s["x"], s["shift"], s["scale"], eps=1e-6, rounding=per_op)

    def gated():
        return ditfuse.gated_residual_adaln(s["x"], s["y"], s["gate"], s["shift"], s["scale"], eps=1e-6,
                                            rounding=per_op)[1]

    return (("modulate", 2, mod), ("gated", 4, gated))


ceil = copy_ceiling_gbps()
print(f"copy ceiling {ceil:.0f} GB/s")
for name in SHAPES:
    base, *over = name.split("+")
    shape = dataclasses.replace(ADALN_SHAPES[base], **{f.split("=")[0]: int(f.split("=")[1])
                                                       for f in over})
    s = adaln_inputs(shape, "cuda", DTYPE, seed=0)
    n = shape.B * shape.S * shape.D * DTYPE.itemsize
    per_op = "per_op" if shape.model == "flux" else "once"
    for op, k, fn in _calls(s, per_op):
        res, ref = [], None
        for cfg in CONFIGS:
            adaln.TILE_SETTINGS = cfg
            try:
                out = fn()
                ref = out if ref is None else ref
                err = (out.float() - ref.float()).abs().max().item()
                us = graph_us(fn)
            except Exception as e:  # noqa: BLE001
                print(f"{name} {op} {cfg}: {type(e).__name__}: {str(e)[:160]}", flush=True)
                continue
            finally:
                adaln.TILE_SETTINGS = None
            pct = 100 * k * n / (us * 1e-6) / 1e9 / ceil
            res.append((us, str(cfg), pct))
            print(f"{name:14s} {op:9s} {'table' if cfg is None else f'rows,warps={cfg}':22s} {us:8.1f} us "
                  f"{pct:6.1f}%  max|d| vs table {err:.3g}", flush=True)
        best = min(res)
        print(f"BEST {name} {op}: {best[1]} {best[0]:.1f} us {best[2]:.1f}%", flush=True)
