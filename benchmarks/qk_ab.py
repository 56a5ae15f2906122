"""Graph time of ``qk_norm_rope`` at registry shapes (session 9: an A/B of two source trees,
run once with PYTHONPATH=src and once with an older copy). Prints us, % of the copy
ceiling (bytes model of ``ditfuse bench``) and the output's max |diff| against the eager
reference (fp64 math rounded to the dtype: a check that the timed call is right).

    python benchmarks/qk_ab.py TAG [--fp32] [--model-tables] same-l-decoder sa3-dit ...

``--model-tables`` (session 10): the RoPE tables as the patched processors pass them (Wan:
the cos[..., 0::2] / sin[..., 1::2] columns repeated for both channels of a pair, or with
``--half`` those columns alone, packed; Qwen-Image: the complex table's real / imaginary
parts, packed), built here so that both trees of an A/B get the same inputs; Wan in place,
as the model and the bench run it (``--out-of-place``: into new tensors). (The first A/B, ``logs/s10/c``, ran the half-width form
for Wan, then the only model form.)
"""
import sys

import torch

import ditfuse
from ditfuse.reference import qk_norm_rope_reference
from ditfuse.bench import copy_ceiling_gbps, graph_us
from ditfuse.shapes import QK_SHAPES
from ditfuse.workloads import qk_inputs

tag = sys.argv[1]
dt = torch.float32 if "--fp32" in sys.argv else torch.bfloat16
names = [a for a in sys.argv[2:] if not a.startswith("--")]
ceil = copy_ceiling_gbps()
for name in names:
    sh = QK_SHAPES[name]
    inp = qk_inputs(sh, "cuda", dt)
    q, k = inp["q"], inp["k"]
    kw = dict(inp["kwargs"], q_norm=inp["q_norm"], k_norm=inp["k_norm"])

    cos, sin = inp["cos"], inp["sin"]
    inplace = False
    if "--model-tables" in sys.argv:
        if sh.form == "flat":  # Wan (--half: the half-width columns, packed)
            cos, sin = cos[..., 0::2], sin[..., 1::2]
            if "--half" in sys.argv:
                cos, sin = cos.contiguous(), sin.contiguous()
            else:
                cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
            inplace = "--out-of-place" not in sys.argv
        elif name.startswith("qwen"):
            cos, sin = cos[..., 0::2].contiguous(), sin[..., 0::2].contiguous()

    def call():
        return ditfuse.qk_norm_rope(q, k, cos, sin, inplace=inplace, **kw)

    # the reference first: in place, the calls overwrite q and k
    ref = qk_norm_rope_reference(q, k, inp["cos"], inp["sin"], compute_dtype=torch.float64, **kw)
    qo, ko = call()
    err = max((qo.double() - ref[0].double()).abs().max().item(),
              (ko.double() - ref[1].double()).abs().max().item())
    us = graph_us(call)
    nbytes = 2 * (q.numel() + k.numel()) * q.element_size() + \
        2 * sh.B * sh.S * cos.shape[-1] * cos.element_size()
    pct = 100 * nbytes / (us * 1e-6) / 1e9 / ceil
    print(f"{tag:6s} {name:18s} {str(dt)[6:]:8s} {us:8.1f} us {pct:5.1f}% of ceiling  "
          f"max|d| vs fp64 {err:.3g}", flush=True)
