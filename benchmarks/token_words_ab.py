"""A/B of the per-token kernel's word form (``qk_norm_rope.TOKEN_WORDS``: interleaved 16-bit
pairs read and written a 32-bit word) against its channel form, each with rows shared by the
heads read once and broadcast (``ROW_BROADCAST``) or per head, at registry shapes, called as
the bench calls them (CUDA-graph us, L2 flushed), with the outputs compared bit for bit; then
the word form over num_warps (``launch_settings``' table was swept on the channel form).

    python benchmarks/token_words_ab.py flux1-1024 flux2-1024 qwen-image-1328 [--warps 2,4,8]
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
SHIPPED = qnr.launch_settings
_fastpath.ENABLED = False  # launch settings change at run time


def main():
    warps = [int(w) for w in sys.argv[sys.argv.index("--warps") + 1].split(",")] \
        if "--warps" in sys.argv else []
    names = [a for a in sys.argv[1:] if a in QK_SHAPES]
    for name in names:
        sh = QK_SHAPES[name]
        inp = qk_inputs(sh, "cuda", torch.bfloat16)
        kw = dict(inp["kwargs"], q_norm=inp["q_norm"], k_norm=inp["k_norm"])
        q0, k0 = inp["q"].clone(), inp["k"].clone()

        def call(inplace):
            return ditfuse.qk_norm_rope(inp["q"], inp["k"], inp["call_cos"], inp["call_sin"],
                                        inplace=inplace, **kw)

        res = {}
        for words in (True, False):
            for row in (True, False):
                qnr.TOKEN_WORDS, qnr.ROW_BROADCAST = words, row
                out = [t.clone() for t in call(False)]
                res[words, row] = (out, graph_us(lambda: call(sh.inplace)))
                inp["q"].copy_(q0)
                inp["k"].copy_(k0)
        base = res[False, False][0]
        for (words, row), (out, us) in res.items():
            diff = [(a != b).sum().item() for a, b in zip(out, base)]
            print(f"{name:20s} {'words' if words else 'channels':8s} "
                  f"{'row-broadcast' if row else 'row-per-head':13s} {us:8.1f} us  "
                  f"elements differing from channels / per-head {diff}", flush=True)
        qnr.TOKEN_WORDS, qnr.ROW_BROADCAST = True, True
        for w in warps:
            qnr.launch_settings = lambda *a, w=w: (*SHIPPED(*a)[:3], w)
            try:
                print(f"{name:20s} words, {w} warps {graph_us(lambda: call(sh.inplace)):8.1f} us",
                      flush=True)
            finally:
                qnr.launch_settings = SHIPPED


if __name__ == "__main__":
    main()
