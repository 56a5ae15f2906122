"""A/B of source changes to the band-attention kernel, each added to the one before, against
the kernel shipped in session 25 (CUDA-graph device time, the table's launch settings).

Session 26 (variants s25, minit, mh, ship):

- "minit": the running max from -FLT_MAX instead of -inf, so no row needs its -inf max
  replaced before the subtraction (a row with no key yet keeps a finite max, its masked
  scores give 2^-inf = 0, alpha multiplies a zero accumulator; its first key's alpha is
  2^(-FLT_MAX - s) = 0 as with -inf): the same bits, sm_90 bf16 SAME-L loop 491 -> 483
  SASS instructions a trip, fp32 (TensorRT contract) 536 -> 532.
- "mh": and the head count a compile-time constant (the program's batch / head split by
  multiplies), 1184 -> 1160 instructions of a bf16 program's code in all.
- "ship": and the band test on the tile's own column index against the row bounds moved
  by the tile's first key (``c - (lo_i - start_n)``: two subtractions a row a trip instead
  of one an element), bf16 loop 483 -> 477.

Session 25 (calls a-c; the variants since removed, see git history): "epi" (shipped: the
output as ``acc1 * (1 / l1) - acc2 * (lambda / l2)``, a multiply and an fma an element,
instead of two divisions), "fma" (1-2% slower in fp32, level in bf16), "order" (level or
0.5% slower).

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

NEW_MINIT = """    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = _ex2(m_i - m_new)
    p = _ex2(s - m_new[:, None])
"""
OLD_MINIT = """    m_new = tl.maximum(m_i, tl.max(s, 1))
    # a row with no key in the band yet keeps max -inf: subtract 0 instead (p = 0, no NaN)
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = _ex2(m_i - m_use)
    p = _ex2(s - m_use[:, None])
"""
NEW_MINIT_2 = "tl.full([BLOCK_M], -3.4028234663852886e38, tl.float32)"
OLD_MINIT_2 = 'tl.full([BLOCK_M], float("-inf"), tl.float32)'
NEW_HCONST = "N, H: tl.constexpr, LEFT, RIGHT,"
OLD_HCONST = "N, H, LEFT, RIGHT,"
NEW_BAND = """    band = (tl.arange(0, BLOCK_N)[None, :] - (row_lo - start_n)[:, None]).to(
        tl.uint32, bitcast=True) <= row_span[:, None].to(tl.uint32, bitcast=True)
"""
OLD_BAND = """    band = (offs_n[None, :] - row_lo[:, None]).to(tl.uint32, bitcast=True) <= \\
        row_span[:, None].to(tl.uint32, bitcast=True)
"""


# variant -> the changes undone in the working tree's kernel: s25 = the kernel shipped in
# session 25 (every change undone), then each change added to the one before
VARIANTS = {"s25": ("minit", "hconst", "band"), "minit": ("hconst", "band"),
            "mh": ("band",), "ship": ()}
CHANGES = {"minit": ((NEW_MINIT, OLD_MINIT), (NEW_MINIT_2, OLD_MINIT_2)),
           "hconst": ((NEW_HCONST, OLD_HCONST),),
           "band": ((NEW_BAND, OLD_BAND),)}


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
    """Every variant's output against the fp64 dense-mask reference (2 heads) and s25's bits."""
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
        same = torch.equal(outs[n], outs["s25"])
        print(f"{case:18s} {str(dt)[6:]:8s} {n:6s} max|d| vs fp64 (2 heads) {err:.3g}, "
              f"bitwise s25's: {same}", flush=True)
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
