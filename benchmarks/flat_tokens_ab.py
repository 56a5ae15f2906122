"""A/B of two tokens a program in the flat kernel's pair form (``qk_norm_rope.FLAT_TOKENS``,
``flat_tokens``: shipped for one-warp programs) against one, at registry shapes, called as
the bench calls them (CUDA-graph us, L2 flushed), alternating twice, outputs compared bit
for bit; ``--all-warps`` also forces two tokens where the programs have 2+ warps.

    python benchmarks/flat_tokens_ab.py wan1.3b-480p wan5b-ti2v-704p [--all-warps]
"""
import importlib
import sys

import torch

import ditfuse
from ditfuse import _fastpath
from ditfuse.bench import graph_us
from ditfuse.shapes import QK_SHAPES
from ditfuse.workloads import qk_inputs

qnr = importlib.import_module("ditfuse.qk_norm_rope")
SHIPPED = qnr.flat_tokens
_fastpath.ENABLED = False  # the setting changes at run time


def main():
    names = [a for a in sys.argv[1:] if a in QK_SHAPES]
    modes = [("1 token", lambda nw, pairs: 1), ("shipped", SHIPPED)]
    if "--all-warps" in sys.argv:
        modes.append(("2 tokens", lambda nw, pairs: 2 if pairs else 1))
    for name in names:
        sh = QK_SHAPES[name]
        inp = qk_inputs(sh, "cuda", torch.bfloat16)
        kw = dict(inp["kwargs"], q_norm=inp["q_norm"], k_norm=inp["k_norm"])
        q0, k0 = inp["q"].clone(), inp["k"].clone()

        def call(inplace):
            return ditfuse.qk_norm_rope(inp["q"], inp["k"], inp["call_cos"], inp["call_sin"],
                                        inplace=inplace, **kw)

        base = None
        for rnd in range(2):
            for label, fn in modes:
                qnr.flat_tokens = fn
                try:
                    out = [t.clone() for t in call(False)]
                    us = graph_us(lambda: call(sh.inplace))
                finally:
                    qnr.flat_tokens = SHIPPED
                    inp["q"].copy_(q0)
                    inp["k"].copy_(k0)
                base = out if base is None else base
                diff = [(a != b).sum().item() for a, b in zip(out, base)]
                print(f"{name:20s} round {rnd} {label:9s} {us:8.1f} us  elements differing "
                      f"from one token a program {diff}", flush=True)


if __name__ == "__main__":
    main()
