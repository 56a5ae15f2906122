"""Session 25 A/B of source changes to the band-attention kernel, each alone and together,
against the session-24 kernel (CUDA-graph device time, the table's launch settings):

- "epi" (the shipped kernel: "ship" in this script now, "epi" in the logs of calls a-c): the
  output as ``acc1 * (1 / l1) - acc2 * (lambda / l2)`` (two per-row factors, a multiply and an
  fma an element) instead of two ``div.full.f32`` divisions an element
  (sm_90 SASS: bf16 SAME-L 1424 -> 1184 instructions a program's code, fp32 1640 -> 1448).
- "minit" and "hconst" (written after call c, built on the CPU, never run on the GPU: four
  starts were refused; reverted): the running max from -FLT_MAX instead of -inf (no test of
  the max for -inf a row and trip: 8 fewer bf16 instructions a trip, the same bits) and the
  head count a compile-time constant (11 fewer a program) -- ~1.8% of a bf16 program's
  instructions, worth ~0.6% if they count as the epilogue's did.
- "fma" (call s25/b, with "epi"; not shipped, since removed from this script): the band
  mask and the row max on the raw scores, a probability ``2^fma(s, scale * log2(e), -m)``
  -- 1-2% slower in fp32, level in bf16.
- "order" (call s25/a, dropped): both score products before either softmax -- level or
  0.5% slower.

The variants are made from the working tree's ``_attn_kernel.py`` by undoing or applying a
change as text (so this file carries no copy of the kernel), written to a temporary package that
imports the shipped helpers, and swapped in for ``ditfuse._attn_kernel._swa_fwd_kernel``
around each timed launch. Every variant's output is checked against the fp64 dense-mask
reference first. Rounds alternate the variants to spread clock drift.

    PYTHONPATH=src python benchmarks/attn_epilogue_ab.py [--rounds 3] [--settings] [--quick]
"""
import importlib.util
import sys
import tempfile
from pathlib import Path

import torch

import ditfuse._attn_kernel as K
from ditfuse._runtime import INTERPRET
from ditfuse import attention as A
from ditfuse import reference as R
from ditfuse.bench import copy_ceiling_gbps, graph_us
from ditfuse.shapes import ATTN_SHAPES

SRC = Path(K.__file__).read_text()
DEV = "cpu" if INTERPRET else "cuda"

NEW_EPI = """    out = acc1 * r1[:, None]
    if DIFF:
        out = tl.fma(acc2, -c2[:, None], out)
"""
# the session-24 epilogue, reached through the same factors' inputs: r1 = 1 / l1s (so
# acc1 / l1s = acc1 / (1 / r1) is not the same bits); pass l1s / lam / l2s instead
OLD_EPI = """    out = acc1 / r1[:, None]
    if DIFF:
        out = out - c2[0][:, None] * (acc2 / c2[1][:, None])
"""
NEW_FACTORS = """    r1 = 1.0 / tl.where(l1 == 0.0, 1.0, l1)
    c2 = 0.0
    if DIFF:
        if LAM_PTR:
            lam_h = tl.load(lam_ptr + h * stride_lam).to(tl.float32)
        else:
            lam_h = lam
        # lam times a reciprocal, not lam / l2: an AOT package binding lam = 1.0 folds the
        # multiply away exactly and computes the JIT kernel's bits
        c2 = lam_h * (1.0 / tl.where(l2 == 0.0, 1.0, l2))
"""
OLD_FACTORS = """    r1 = tl.where(l1 == 0.0, 1.0, l1)
    c2 = (0.0, 0.0)
    if DIFF:
        if LAM_PTR:
            lam_h = tl.load(lam_ptr + h * stride_lam).to(tl.float32)
        else:
            lam_h = lam
        c2 = (lam_h + tl.zeros_like(r1), tl.where(l2 == 0.0, 1.0, l2))
"""


# variant -> the changes undone in the working tree's (shipped) kernel
VARIANTS = {"s24": ("epi",), "ship": ()}
CHANGES = {"epi": ((NEW_EPI, OLD_EPI), (NEW_FACTORS, OLD_FACTORS))}


def variant(name: str) -> str:
    s = SRC
    for change, pairs in CHANGES.items():
        for new, old in pairs:
            assert new in s, "the working tree's kernel is not the one this A/B expects"
            if change in VARIANTS[name]:
                s = s.replace(new, old)
    return s.replace("from ._", "from ditfuse._")


def load_variants(names):
    d = Path(tempfile.mkdtemp(prefix="attn_ab_"))
    out = {}
    for n in names:
        f = d / f"attn_kernel_{n}.py"
        f.write_text(variant(n))
        spec = importlib.util.spec_from_file_location(f"attn_kernel_{n}", f)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
        out[n] = mod._swa_fwd_kernel
    return out


def inputs(name, dt):
    sh = ATTN_SHAPES[name]
    if DEV == "cpu":  # interpreter check of the variants: a small cut of the shape
        sh = sh._replace(N=150, H=2) if hasattr(sh, "_replace") else \
            __import__("dataclasses").replace(sh, N=150, H=2)
    n_in = 5 if sh.differential else 3
    g = torch.Generator(device=DEV).manual_seed(0)
    proj = torch.randn(sh.B, sh.N, n_in * sh.H * sh.D, generator=g, device=DEV).to(dt)
    parts = [t.unflatten(-1, (sh.H, sh.D)) for t in proj.chunk(n_in, dim=-1)]
    if sh.differential:
        q1, q2, k1, k2, v = parts
    else:
        (q1, k1, v), q2, k2 = parts, None, None
    nbytes = (n_in + 1) * sh.B * sh.N * sh.H * sh.D * proj.element_size()
    return sh, (q1, k1, v, q2, k2), nbytes


def fp64_reference(sh, t):
    """The dense-mask formula in fp64 (``reference.sliding_window_attention_core`` without its
    final rounding to the input dtype)."""
    q1, k1, v, q2, k2 = (x.double() if x is not None else None for x in t)
    N, D = q1.shape[1], q1.shape[3]
    keep = R.band_keep(N, sh.window, sh.window, q1.device)
    bias = torch.zeros(N, N, dtype=torch.float64, device=q1.device).masked_fill(~keep, float("-inf"))
    out = R._masked_attention(q1, k1, v, bias, D ** -0.5, torch.float64)
    if q2 is not None:
        out = out - R._masked_attention(q2, k2, v, bias, D ** -0.5, torch.float64)
    return out


def check(case, dt, names, kern, shipped):
    """Every variant's output against the fp64 dense-mask reference (2 heads) and s24's."""
    sh, (q1, k1, v, q2, k2), nbytes = inputs(case, dt)
    p = A.plan(q1, k1, v, sh.window, q2=q2, k2=k2)
    # fp64 dense-mask reference on 2 heads (the whole (N, N) mask at 32946 is 8.7 GB)
    hs = slice(0, 2)
    ref = fp64_reference(sh, [t[:, :, hs] if t is not None else None
                              for t in (q1, k1, v, q2, k2)]) if sh.N <= 9000 else None
    outs = {}
    for n in names:
        K._swa_fwd_kernel = kern[n]
        try:
            outs[n] = A.run(p, tuple(A.launch_settings(sh.D, dt, sh.window, sh.window, sh.N,
                                                       sh.differential, False)))
        finally:
            K._swa_fwd_kernel = shipped
        err = (outs[n][:, :, hs].double() - ref).abs().max().item() if ref is not None else float("nan")
        d24 = (outs[n].float() - outs["s24"].float()).abs().max().item()
        same = ""
        print(f"{case:18s} {str(dt)[6:]:8s} {n:6s} max|d| vs fp64 (2 heads) {err:.3g}, "
              f"vs s24 {d24:.3g}{same}", flush=True)
    return p, nbytes


def main():
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 3
    names = list(VARIANTS)
    kern = load_variants(names)
    shipped = K._swa_fwd_kernel
    if DEV == "cpu":
        cases = [("same-l-8704", torch.bfloat16), ("same-l-trt", torch.float32),
                 ("same-l-8704-plain", torch.float32)]
        for case, dt in cases:
            check(case, dt, names, kern, shipped)
        return
    ceil = copy_ceiling_gbps()
    print(f"copy ceiling {ceil:.0f} GB/s", flush=True)
    cases = [("same-l-8704", torch.bfloat16), ("same-l-trt", torch.float32),
             ("same-l-8704", torch.float32), ("same-l-32946", torch.bfloat16),
             ("same-l-trt", torch.bfloat16), ("same-l-8704-plain", torch.bfloat16),
             ("same-l-8704-plain", torch.float32)]
    if "--quick" in sys.argv:  # the targets' cases only
        cases = [("same-l-8704", torch.bfloat16), ("same-l-trt", torch.float32),
                 ("same-l-8704", torch.float32)]
    extra = [None]
    if "--settings" in sys.argv:  # the table's neighbours, with the working tree's kernel
        extra += [(64, 32, 4, 3, True, None, 62), (64, 32, 4, 4, True, 168, 62),
                  (32, 16, 2, 3, True, 168, 30, False, True), (32, 16, 2, 4, True, 168, 30, False, True)]
    for case, dt in cases:
        p, nbytes = check(case, dt, names, kern, shipped)
        times = {n: [] for n in names}
        for _ in range(rounds):
            for n in names:
                K._swa_fwd_kernel = kern[n]
                try:
                    times[n].append(graph_us(lambda: A.run(p)))
                finally:
                    K._swa_fwd_kernel = shipped
        for n in names:
            best = min(times[n])
            pct = 100 * nbytes / (best * 1e-6) / 1e9 / ceil
            print(f"{case:18s} {str(dt)[6:]:8s} {n:6s} " + " ".join(f"{t:7.1f}" for t in times[n])
                  + f"  min {best:7.1f} us  {pct:5.1f}% of floor", flush=True)
        for st in extra[1:]:
            try:
                us = graph_us(lambda st=st: A.run(p, st))
                print(f"{case:18s} {str(dt)[6:]:8s} ship   {st} {us:7.1f} us", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"{case:18s} {str(dt)[6:]:8s} ship   {st} {type(e).__name__}: {str(e)[:120]}")


if __name__ == "__main__":
    main()
