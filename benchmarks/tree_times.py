"""CUDA-graph time (us, L2 flushed before every replay) of ditfuse's ops at registry shapes,
called as the bench calls them, for an A/B of source trees (session 11): run it once per
tree with PYTHONPATH pointing at the tree, alternating, and compare the lines.

    python benchmarks/tree_times.py TAG qk:flux1-1024,qwen-image-1328 adaln:flux1-1024 \
        attn:same-l-8704,same-l-trt gn:flux-vae-mid-128 [--dtype bf16|fp32]

qk: ``qk_norm_rope`` with the tables as the patched models pass them (``call_cos``), in
place where the model's processor is; adaln: ``adaln_modulate`` and ``gated_residual_adaln``
(FLUX rounding per op, as the FLUX processors); attn: ``sliding_window_attention`` on the
chunks of SAME's packed to_qkv output; gn: GroupNorm + SiLU / the channel RMS + SiLU.
Each line also prints a checksum of the output (the same in both trees when the change
keeps the bits).
"""
import sys

import torch

import ditfuse
from ditfuse.bench import graph_us
from ditfuse.shapes import ADALN_SHAPES, ATTN_SHAPES, GN_SHAPES, QK_SHAPES
from ditfuse.workloads import adaln_inputs, qk_inputs

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def qk_call(name, dt):
    sh = QK_SHAPES[name]
    inp = qk_inputs(sh, "cuda", dt)
    kw = dict(inp["kwargs"], q_norm=inp["q_norm"], k_norm=inp["k_norm"], inplace=sh.inplace)
    return lambda: ditfuse.qk_norm_rope(inp["q"], inp["k"], inp["call_cos"], inp["call_sin"], **kw)[0]


def adaln_calls(name, dt):
    sh = ADALN_SHAPES[name]
    s = adaln_inputs(sh, "cuda", dt)
    r = "per_op" if sh.model == "flux" else "once"
    yield "modulate", lambda: ditfuse.adaln_modulate(s["x"], s["shift"], s["scale"], eps=1e-6,
                                                     rounding=r)
    yield "gated", lambda: ditfuse.gated_residual_adaln(s["x"], s["y"], s["gate"], s["shift"],
                                                        s["scale"], eps=1e-6, rounding=r)[1]


def attn_call(name, dt):
    sh = ATTN_SHAPES[name]
    n_in = 5 if sh.differential else 3
    g = torch.Generator(device="cuda").manual_seed(0)
    proj = torch.randn(sh.B, sh.N, n_in * sh.H * sh.D, generator=g, device="cuda").to(dt)
    p = [t.unflatten(-1, (sh.H, sh.D)) for t in proj.chunk(n_in, dim=-1)]
    if sh.differential:
        return lambda: ditfuse.sliding_window_attention(p[0], p[2], p[4], sh.window, q2=p[1],
                                                        k2=p[3])
    return lambda: ditfuse.sliding_window_attention(p[0], p[1], p[2], sh.window)


def gn_call(name, dt, launch=None):
    """GroupNorm + SiLU / the channel RMS + SiLU at a registry shape (``launch``: launch-table
    overrides, ``_launch``; benchmarks/gn_times.py's sweeps)."""
    sh = GN_SHAPES[name]
    C = sh.shape[1]
    g = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(sh.shape, generator=g, device="cuda") * 2 + 0.5).to(dt)
    ps = (C,) + (1,) * (len(sh.shape) - 2) if sh.op == "rms" else (C,)
    w = (torch.randn(ps, generator=g, device="cuda") * 0.5 + 1).to(dt)
    b = (torch.randn(ps, generator=g, device="cuda") * 0.2).to(dt)
    if sh.op == "rms":
        return lambda: ditfuse.rms_norm_silu_channels(x, w, b, _launch=launch)
    return lambda: ditfuse.group_norm_silu(x, sh.groups, w, b, 1e-6, _launch=launch)


def main():
    tag = sys.argv[1]
    dt = DT[sys.argv[sys.argv.index("--dtype") + 1]] if "--dtype" in sys.argv else torch.bfloat16
    for arg in sys.argv[2:]:
        if ":" not in arg:
            continue
        op, names = arg.split(":", 1)
        for name in names.split(","):
            if op == "qk":
                calls = [("", qk_call(name, dt))]
            elif op == "adaln":
                calls = list(adaln_calls(name, dt))
            elif op == "attn":
                calls = [("", attn_call(name, dt))]
            elif op == "gn":
                calls = [("", gn_call(name, dt))]
            else:
                raise SystemExit(f"unknown op {op!r} (qk, adaln, attn, gn)")
            for sub, fn in calls:
                out = fn()
                chk = out.double().abs().sum().item()  # in place: of the first call's output
                us = graph_us(fn)
                label = f"{op}{'/' + sub if sub else ''}"
                print(f"{tag:6s} {label:15s} {name:20s} {str(dt)[6:]:8s} {us:8.1f} us  "
                      f"sum|out| {chk:.6e}", flush=True)


if __name__ == "__main__":
    main()
