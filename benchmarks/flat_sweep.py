"""CUDA-graph time (us, L2 flushed) of the flat kernel at Wan's registry rows with the tables
the patched processor passes (half width since session 15), over (num_warps, split) --
``flat_settings``'s table was swept with full-width tables (session 8) -- plus the
full-width tables at the shipped settings for reference.

    python benchmarks/flat_sweep.py wan1.3b-480p wan14b-480p
"""
import sys

import torch

import ditfuse
import importlib
from ditfuse import _fastpath
from ditfuse.bench import graph_us
from ditfuse.shapes import QK_SHAPES
from ditfuse.workloads import qk_inputs

qnr = importlib.import_module("ditfuse.qk_norm_rope")
SHIPPED = qnr.flat_settings
_fastpath.ENABLED = False  # the launch table changes at run time


DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def timed(name, settings, full=False, dtype=torch.bfloat16):
    sh = QK_SHAPES[name]
    inp = qk_inputs(sh, "cuda", dtype)
    kw = dict(inp["kwargs"], q_norm=inp["q_norm"], k_norm=inp["k_norm"], inplace=sh.inplace)
    cos, sin = (inp["call_cos"], inp["call_sin"])
    if full:
        cos = cos.repeat_interleave(2, -1)
        sin = sin.repeat_interleave(2, -1)
    qnr.flat_settings = settings
    try:
        f = lambda: ditfuse.qk_norm_rope(inp["q"], inp["k"], cos, sin, **kw)  # noqa: E731
        f()
        return graph_us(f)
    finally:
        qnr.flat_settings = SHIPPED


def main():
    full = "--full" in sys.argv  # sweep with full-width tables as well
    dt = DT[sys.argv[sys.argv.index("--dtype") + 1]] if "--dtype" in sys.argv else torch.bfloat16
    for name in [a for a in sys.argv[1:] if a in QK_SHAPES]:
        sh = QK_SHAPES[name]
        n0, n1, m0, m1, w0, s0 = SHIPPED(sh.H, sh.D, True)
        print(f"{name:20s} shipped warps={w0} split={s0}: {timed(name, SHIPPED, dtype=dt):8.1f} us "
              f"(full-width tables {timed(name, SHIPPED, full=True, dtype=dt):8.1f} us) {dt}", flush=True)
        for split in (False, True):
            for warps in (1, 2, 4, 8):
                st = lambda H, D, k, w=warps, s=split: (n0, n1, m0, m1, w, s)  # noqa: E731
                extra = f"  full-width {timed(name, st, True, dt):8.1f} us" if full else ""
                print(f"{name:20s} warps={warps} split={split!s:5s}       "
                      f"{timed(name, st, dtype=dt):8.1f} us{extra}", flush=True)


if __name__ == "__main__":
    main()
