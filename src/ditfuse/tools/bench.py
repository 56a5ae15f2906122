"""``ditfuse bench``: time every op at the registry's production shapes on the GPU.

For each (op, shape, dtype), in one run: a copy of the op's bytes, the eager code the
model runs (as diffusers writes it), ``torch.compile`` of that code, ditfuse, and peers
when importable (Liger-Kernel). Times are ``triton.testing.do_bench`` medians on random
data; do_bench zeroes a 256 MB buffer before every call, so no input starts in L2, and
inputs are also rotated over several copies when one set would fit in L2. The copy
ceiling is a 2 GiB device-to-device copy measured in the same run.

Writes ``benchmarks/results/<gpu>-<date>.csv`` (columns op, shape, impl, dtype, us, gbps,
pct_copy, gpu, torch, triton, date) and a PNG chart next to it.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import math
import os
import sys
import time

import torch

from ditfuse.tools.shapes import QK_SHAPES

L2_BYTES = 60 * 2**20
_DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEFAULT_EXTRA_DTYPE_SHAPES = ("wan14b-480p", "flux1-1024", "flux2-1024", "sa3-dit",  # any registry
                              "same-l-8704", "same-l-trt")


def _median_us(fn, warmup=25, rep=100) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=warmup, rep=rep, return_mode="median") * 1e3


def graph_us(fn) -> float:
    """GPU time of ``fn`` (one call, warmed up) captured in a CUDA graph and replayed:
    do_bench median, L2 flushed before every replay. The sweeps' timer."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return _median_us(g.replay)


def copy_ceiling_gbps(device="cuda") -> float:
    x = torch.randn(2**30, device=device, dtype=torch.bfloat16)  # 2 GiB
    y = torch.empty_like(x)
    us = _median_us(lambda: y.copy_(x), rep=200)
    return 2 * 2**31 / (us * 1e-6) / 1e9  # x and y are freed on return


def _rotating(make, nbytes: int):
    """A callable cycling over copies of the inputs so that together they exceed 3x L2."""
    n = max(1, min(8, math.ceil(3 * L2_BYTES / max(nbytes, 1))))
    sets = [make(i) for i in range(n)]
    state = {"i": 0}

    def next_set():
        state["i"] = (state["i"] + 1) % n
        return sets[state["i"]]

    return next_set, sets


def _liger_fn(shape):
    """Liger-Kernel's RMSNorm on the per-head rows, then the eager RoPE (where it applies)."""
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except Exception:
        return None
    if shape.norm != "rms" or shape.span != "head" or shape.style != "interleaved" or shape.form != "bshd":
        return None
    from ditfuse.tools.workloads import _rope_interleaved

    def f(inp):
        q, k, cos, sin = inp["q"], inp["k"], inp["cos"], inp["sin"]
        qn = LigerRMSNormFunction.apply(q, inp["q_norm"].weight, inp["q_norm"].eps, 0.0, "llama", False)
        kn = LigerRMSNormFunction.apply(k, inp["k_norm"].weight, inp["k_norm"].eps, 0.0, "llama", False)
        c, s = cos[None, :, None], sin[None, :, None]
        return _rope_interleaved(qn, c, s), _rope_interleaved(kn, c, s)

    return f


def bench_case(op, shape_name, dtype, nbytes, make, eager, fused, copy_of, ceiling, emit, impls,
               peers=(), device="cuda", timer=None):
    """Time one (op, shape, dtype) for every implementation in ``impls``.

    ``make(i)`` builds input set i; ``eager(inp)`` / ``fused(inp)`` run the model's code /
    ditfuse; ``copy_of(inp)`` lists the tensors whose bytes the op must move (the copy
    row); ``peers``: (name, fn) pairs. ``timer(fn) -> us`` (default: do_bench median).
    """
    timer = timer or _median_us
    gpu = device != "cpu"
    next_set, sets = _rotating(make, nbytes)

    def row(impl, us):
        gbps = nbytes / (us * 1e-6) / 1e9
        emit(op, shape_name, impl, dtype, us, gbps, 100 * gbps / ceiling)

    if "copy" in impls:  # the op's bytes, read and written once, as contiguous copies
        src = [[t.contiguous() for t in copy_of(s)] for s in sets]
        dst = [[torch.empty_like(t) for t in ts] for ts in src]
        st = {"i": 0}

        def copy():
            st["i"] = (st["i"] + 1) % len(src)
            for a, b in zip(dst[st["i"]], src[st["i"]]):
                a.copy_(b)

        row("copy", timer(copy))
        del src, dst
    with torch.no_grad():
        if "eager" in impls:
            row("eager", timer(lambda: eager(next_set())))
        if "compile" in impls:
            torch._dynamo.reset()
            comp = torch.compile(eager, dynamic=False)
            comp(next_set())
            if gpu:
                torch.cuda.synchronize()
            row("compile", timer(lambda: comp(next_set())))
            del comp
        if "ditfuse" in impls:
            fused(next_set())
            row("ditfuse", timer(lambda: fused(next_set())))
            if "ditfuse-graph" in impls and gpu:  # replayed from a CUDA graph: GPU time only
                graphs = []
                for s in sets:
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g):
                        fused(s)
                    graphs.append(g)
                gi = {"i": 0}

                def replay():
                    gi["i"] = (gi["i"] + 1) % len(graphs)
                    graphs[gi["i"]].replay()

                replay()
                row("ditfuse-graph", timer(replay))
                del graphs
        for name, fn in peers:
            if name in impls and fn is not None:
                fn(next_set())
                row(name, timer(lambda: fn(next_set())))
    del sets


def bench_qk(shape, dtype, ceiling, emit, impls, device="cuda", timer=None):
    import ditfuse
    from ditfuse.tools.workloads import eager_fn, qk_bytes, qk_inputs

    inplace = shape.inplace  # as the patched processor calls it (Wan, HunyuanVideo)

    def fused(s):
        return ditfuse.qk_norm_rope(s["q"], s["k"], s["call_cos"], s["call_sin"], q_norm=s["q_norm"],
                                    k_norm=s["k_norm"], inplace=inplace, **s["kwargs"])

    bench_case("qk_norm_rope", shape.name, dtype, qk_bytes(shape, dtype),
               lambda i: qk_inputs(shape, device, dtype, seed=i), eager_fn(shape), fused,
               lambda s: (s["q"], s["k"]), ceiling, emit, impls,
               peers=[("liger", _liger_fn(shape) if "liger" in impls else None)],
               device=device, timer=timer)


def bench_adaln(shape, dtype, ceiling, emit, impls, device="cuda", timer=None):
    """The AdaLN ops at one shape: modulate; gated residual + norm + modulate; the gated
    residual alone (bytes: x and y read, x_new written; the copy row copies x and y)."""
    import ditfuse
    from ditfuse.tools.workloads import adaln_eager, adaln_inputs

    per_op = "per_op" if shape.model == "flux" else "once"
    el = torch.empty((), dtype=dtype).element_size()
    n = shape.B * shape.S * shape.D
    mod_bytes = 2 * n * el  # x read, y written (temb rows are negligible unless per token)
    if shape.per_token:
        mod_bytes += 2 * n * 4
    res_bytes = 4 * n * el + (3 * n * 4 if shape.per_token else 0)
    eager_mod, eager_res, eager_gr = adaln_eager(shape)
    make = lambda i: adaln_inputs(shape, device, dtype, seed=i)  # noqa: E731
    bench_case("adaln_modulate", shape.name, dtype, mod_bytes, make, eager_mod,
               lambda s: ditfuse.adaln_modulate(s["x"], s["shift"], s["scale"], eps=1e-6,
                                                rounding=per_op),
               lambda s: (s["x"],), ceiling, emit, impls, device=device, timer=timer)
    bench_case("gated_residual_adaln", shape.name, dtype, res_bytes, make, eager_res,
               lambda s: ditfuse.gated_residual_adaln(s["x"], s["y"], s["gate"], s["shift"],
                                                      s["scale"], eps=1e-6, rounding=per_op),
               lambda s: (s["x"], s["y"]), ceiling, emit, impls, device=device, timer=timer)
    bench_case("gated_residual", shape.name, dtype, 3 * n * el + (n * 4 if shape.per_token else 0), make,
               eager_gr, lambda s: ditfuse.gated_residual(s["x"], s["y"], s["gate"], rounding=per_op),
               lambda s: (s["x"], s["y"]), ceiling, emit, impls, device=device, timer=timer)


def bench_activation(shape, dtype, ceiling, emit, impls, device="cuda", timer=None):
    """SwiGLU (FLUX.2) or GELU tanh (FLUX.1) at one shape; eager as diffusers writes it
    (``F.silu(x[..., :H]) * x[..., H:]``: two kernels, 5N elements moved; ``F.gelu``),
    ``torch.compile`` of that, ditfuse. Floor: x read, y written (SwiGLU 3N, GELU 2N
    elements); the copy row copies x. x is the projection's column slice where the model
    reads one (``shape.offset``)."""
    import torch.nn.functional as F

    import ditfuse

    B, S, N, W = shape.B, shape.S, shape.N, shape.W
    el = torch.empty((), dtype=dtype).element_size()
    nbytes = B * S * (W + N) * el

    def make(i):
        g = torch.Generator(device=device).manual_seed(i)
        proj = torch.randn(B, S, shape.offset + W, generator=g, device=device).to(dtype)
        return dict(x=proj[..., shape.offset:])

    if shape.op == "swiglu":
        def eager(s):  # Flux2SwiGLU.forward
            x = s["x"]
            half = x.shape[-1] // 2
            return F.silu(x[..., :half]) * x[..., half:]

        def fused(s):
            return ditfuse.swiglu(s["x"])
    else:
        def eager(s):  # FluxSingleTransformerBlock.act_mlp
            return F.gelu(s["x"], approximate="tanh")

        def fused(s):
            return ditfuse.gelu(s["x"], "tanh")

    bench_case(shape.op, shape.name, dtype, nbytes, make, eager, fused, lambda s: (s["x"],),
               ceiling, emit, impls, device=device, timer=timer)


def bench_group_norm(shape, dtype, ceiling, emit, impls, device="cuda", timer=None):
    """GroupNorm + SiLU (or Wan's channel RMS norm + SiLU) at one VAE shape. The floor
    counts one read of x when a group fits on chip (the fit path) and two when it cannot
    (the split path), plus one write (see gn_settings)."""
    import math

    import torch.nn.functional as F

    import ditfuse
    from ditfuse.ops.group_norm import gn_settings

    N, C = shape.shape[:2]
    sp = math.prod(shape.shape[2:])
    el = torch.empty((), dtype=dtype).element_size()
    reads = 1 if shape.op == "rms" or gn_settings(
        N, shape.groups, C // shape.groups, sp, c_inner=shape.channels_last).path == "fit" else 2
    nbytes = (reads + 1) * N * C * sp * el
    pshape = (C,) + (1,) * (len(shape.shape) - 2)

    def make(i):
        g = torch.Generator(device=device).manual_seed(i)
        x = shape.layout((torch.randn(shape.shape, generator=g, device=device) * 2 + 0.5).to(dtype))
        w = (torch.randn(pshape if shape.op == "rms" else (C,), generator=g, device=device) * 0.5 + 1).to(dtype)
        b = (torch.randn(pshape if shape.op == "rms" else (C,), generator=g, device=device) * 0.2).to(dtype)
        return dict(x=x, w=w, b=b)

    if shape.op == "rms":  # diffusers' WanRMS_norm then SiLU
        def eager(s):
            return F.silu(F.normalize(s["x"], dim=1) * C**0.5 * s["w"] + s["b"])

        def fused(s):
            return ditfuse.rms_norm_silu_channels(s["x"], s["w"], s["b"])
    else:
        def eager(s):
            return F.silu(F.group_norm(s["x"], shape.groups, s["w"], s["b"], 1e-6))

        def fused(s):
            return ditfuse.group_norm_silu(s["x"], shape.groups, s["w"], s["b"], 1e-6)

    bench_case("group_norm_silu" if shape.op == "gn" else "rms_norm_silu", f"{shape.name}",
               dtype, nbytes, make, eager, fused, lambda s: (s["x"],), ceiling, emit, impls,
               device=device, timer=timer)


def attention_copy_parts(parts):
    """The tensors the attention rows' ``copy`` moves (each read and written once): half of
    the (B, N, H, D) projection chunks, rounded up -- as many bytes as the floor counts (the
    n inputs read, the output written: n + 1 tensors' worth). Before 2026-12-01 every chunk
    and the output's size were copied, twice the floor's bytes (docs/design/attention.md)."""
    return list(parts[:(len(parts) + 1) // 2])


def bench_attention(shape, dtype, ceiling, emit, impls, device="cuda", timer=None):
    """Band (differential) attention: dense-mask SDPA as diffusers' SAME runs it,
    FlexAttention with a sliding-window block mask, and ditfuse. Floor: q/k (both halves when
    differential) and v read once, the output written once.  In fp32 the ``ditfuse`` rows multiply in
    tf32 (``precision="high"``), the ``ditfuse-highest`` rows fp32-accurately (PyTorch's
    default ``"highest"``), and FlexAttention at the process's setting (``"highest"``)."""
    import torch.nn.functional as F

    import ditfuse

    B, N, H, D, w = shape.B, shape.N, shape.H, shape.D, shape.window
    el = torch.empty((), dtype=dtype).element_size()
    n_in = 5 if shape.differential else 3
    nbytes = (n_in + 1) * B * N * H * D * el

    def make(i):
        g = torch.Generator(device=device).manual_seed(i)
        proj = torch.randn(B, N, n_in * H * D, generator=g, device=device).to(dtype)
        parts = [t.unflatten(-1, (H, D)) for t in proj.chunk(n_in, dim=-1)]  # SAME's to_qkv views
        return dict(proj=proj, parts=parts)

    mask = None
    if "eager" in impls:
        idx = torch.arange(N, device=device)
        keep = (idx[None, :] - idx[:, None]).abs() <= w
        mask = torch.zeros(N, N, dtype=dtype, device=device).masked_fill(~keep, float("-inf"))

    def eager(s):  # SAMEAttnProcessor with diffusers' dense _band_mask
        p = [t.transpose(1, 2) for t in s["parts"]]
        if shape.differential:
            q1, q2, k1, k2, v = p
            return (F.scaled_dot_product_attention(q1, k1, v, attn_mask=mask)
                    - F.scaled_dot_product_attention(q2, k2, v, attn_mask=mask))
        q, k, v = p
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def fused(s, precision="high"):  # fp32: tf32 products (the "ditfuse" rows since 2026-11-29)
        p = s["parts"]
        if shape.differential:
            q1, q2, k1, k2, v = p
            return ditfuse.sliding_window_attention(q1, k1, v, w, q2=q2, k2=k2,
                                                    precision=precision)
        q, k, v = p
        return ditfuse.sliding_window_attention(q, k, v, w, precision=precision)

    highest = None
    if dtype == torch.float32:  # PyTorch's default float32 matmul precision: fp32-accurate

        def highest(s):
            return fused(s, "highest")

    flex = None
    if "flex" in impls and device != "cpu":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        bm = create_block_mask(lambda b, h, qi, ki: (qi - ki).abs() <= w, None, None, N, N,
                               device=device)
        fa = torch.compile(flex_attention)

        def flex(s):
            p = [t.transpose(1, 2) for t in s["parts"]]
            if shape.differential:
                q1, q2, k1, k2, v = p
                return fa(q1, k1, v, block_mask=bm) - fa(q2, k2, v, block_mask=bm)
            q, k, v = p
            return fa(q, k, v, block_mask=bm)

    bench_case("sliding_window_attention", shape.name, dtype, nbytes, make, eager, fused,
               lambda s: attention_copy_parts(s["parts"]), ceiling, emit,
               impls - {"compile"}, peers=[("flex", flex), ("ditfuse-highest", highest)],
               device=device, timer=timer)


def _chart(rows, path):
    """One panel per op: % of the copy ceiling per (shape, dtype) and implementation. Bars
    above 150% (copies of inputs small enough to stay in L2) are clipped and labelled."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # pragma: no cover
        print(f"(no chart: {e})")
        return
    ops = list(dict.fromkeys(r["op"] for r in rows))
    impls = [i for i in ("copy", "ditfuse-graph", "ditfuse", "liger", "flex", "compile", "eager")
             if any(r["impl"] == i for r in rows)]
    colors = dict(zip(impls, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    widest = max(len({(r["shape"], r["dtype"]) for r in rows if r["op"] == op}) for op in ops)
    fig, axes = plt.subplots(len(ops), 1, figsize=(max(8, 0.75 * widest + 2), 3.2 * len(ops)),
                             squeeze=False)
    top = 150
    for ax, op in zip(axes[:, 0], ops):
        keys = list(dict.fromkeys((r["shape"], r["dtype"]) for r in rows if r["op"] == op))
        here = [i for i in impls if any(r["impl"] == i and r["op"] == op for r in rows)]
        w = 0.8 / len(here)
        for j, impl in enumerate(here):
            for i, k in enumerate(keys):
                m = [r for r in rows if (r["op"], r["shape"], r["dtype"]) == (op, *k) and r["impl"] == impl]
                if not m:
                    continue
                v = float(m[0]["pct_copy"])
                x = i + j * w
                ax.bar(x, min(v, top), w, color=colors[impl], label=impl if i == 0 else None)
                if v > top:
                    ax.text(x, top, f"{v:.0f}", ha="center", va="bottom", fontsize=5, rotation=90)
        ax.set_xticks([i + 0.4 - w / 2 for i in range(len(keys))])
        ax.set_xticklabels([f"{sh}\n{d}" for sh, d in keys], fontsize=6)
        ax.set_ylim(0, top + 15)
        ax.axhline(100, color="k", lw=0.5)
        ax.set_ylabel("% of copy ceiling", fontsize=7)
        ax.set_title(op, fontsize=8, loc="left")
        ax.legend(fontsize=6, ncol=len(here), loc="upper right")
    fig.suptitle(f"ditfuse on {rows[0]['gpu']} ({rows[0]['date']}): higher is better", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"chart: {path}")


COLUMNS = ["op", "shape", "impl", "dtype", "us", "gbps", "pct_copy", "gpu", "torch", "triton", "date"]


def _write_csv(rows, path):
    with open(path, "w") as f:
        f.write(",".join(COLUMNS) + "\n")
        for r in rows:
            f.write(",".join(f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c]) for c in COLUMNS) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="ditfuse bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", default="all",
                    choices=["all", "qk_norm_rope", "adaln", "activations", "group_norm", "attention"])
    ap.add_argument("--shapes", default="all", help="comma-separated registry names, or 'all'")
    ap.add_argument("--dtypes", default="bf16", help="comma-separated: bf16,fp16,fp32")
    ap.add_argument("--extra-dtypes", default="fp16,fp32",
                    help=f"also time these dtypes at {', '.join(DEFAULT_EXTRA_DTYPE_SHAPES)}")
    ap.add_argument("--impls", default="copy,eager,compile,ditfuse,ditfuse-graph,liger,flex,"
                                       "ditfuse-highest")
    ap.add_argument("--out-dir", default="benchmarks/results")
    ap.add_argument("--e2e", action="store_true",
                    help="whole models (random weights): transformers unpatched/patched x eager/compile "
                         "and a 20-step trajectory comparison; SAME-L decode of 1 and 3 minutes")
    ap.add_argument("--models", default="all",
                    help="with --e2e: comma-separated, from wan14b-480p,flux1-1024,flux2-1024,qwen-image-1328,hunyuan-video-544p,same-l")
    ap.add_argument("--no-compile", action="store_true", help="with --e2e: skip the torch.compile rows")
    ap.add_argument("--layers", type=int, default=2, help="with --e2e: double-stream blocks")
    args = ap.parse_args(argv)
    if args.e2e:
        from ditfuse.tools.e2e import main as e2e_main
        return e2e_main(args)
    if not torch.cuda.is_available():
        print("ditfuse bench: no CUDA GPU here; benchmarks need one (use `ditfuse check` on the CPU)",
              file=sys.stderr)
        return 2
    import triton

    from ditfuse.tools.shapes import ACT_SHAPES, ADALN_SHAPES, ATTN_SHAPES, GN_SHAPES

    registries = {"qk_norm_rope": (QK_SHAPES, bench_qk), "adaln": (ADALN_SHAPES, bench_adaln),
                  "activations": (ACT_SHAPES, bench_activation),
                  "group_norm": (GN_SHAPES, bench_group_norm),
                  "attention": (ATTN_SHAPES, bench_attention)}
    ops = list(registries) if args.op == "all" else [args.op]
    jobs = []
    for op in ops:
        reg, _ = registries[op]
        names = list(reg) if args.shapes == "all" else [n for n in args.shapes.split(",") if n in reg]
        if args.shapes != "all":
            unknown = [n for n in args.shapes.split(",") if not any(n in registries[o][0] for o in ops)]
            if unknown:
                print(f"unknown shape(s) {unknown}; known: {', '.join(n for o in ops for n in registries[o][0])}",
                      file=sys.stderr)
                return 2
        jobs += [(op, n, d) for d in args.dtypes.split(",") for n in names]
        if args.extra_dtypes:
            jobs += [(op, n, d) for d in args.extra_dtypes.split(",") for n in DEFAULT_EXTRA_DTYPE_SHAPES
                     if n in names and (op, n, d) not in jobs]
    impls = set(args.impls.split(","))
    torch._dynamo.config.cache_size_limit = 256
    gpu = torch.cuda.get_device_name()
    date = _dt.date.today().isoformat()
    ceiling = copy_ceiling_gbps()
    print(f"{gpu}: copy ceiling {ceiling:.0f} GB/s (2 GiB device-to-device); torch "
          f"{torch.__version__}, triton {triton.__version__}")
    print(f"{'op':20s} {'shape':20s} {'dtype':5s} {'impl':13s} {'us':>10s} {'GB/s':>8s} {'%copy':>6s}")
    rows = []

    def emit(op, shape, impl, dtype, us, gbps, pct):
        dname = {v: k for k, v in _DT.items()}[dtype]
        rows.append(dict(op=op, shape=shape, impl=impl, dtype=dname, us=us, gbps=gbps, pct_copy=pct,
                         gpu=gpu, torch=torch.__version__, triton=triton.__version__, date=date))
        print(f"{op:20s} {shape:20s} {dname:5s} {impl:13s} {us:10.1f} {gbps:8.0f} {pct:6.1f}", flush=True)

    os.makedirs(args.out_dir, exist_ok=True)
    stem = os.path.join(args.out_dir, f"{gpu.replace(' ', '-')}-{date}")
    t0 = time.time()
    for i, (op, n, d) in enumerate(jobs):
        print(f"[{i + 1}/{len(jobs)}] {op} {n} {d} ({time.time() - t0:.0f} s)", flush=True)
        reg, fn = registries[op]
        fn(reg[n], _DT[d], ceiling, emit, impls)
        torch.cuda.empty_cache()
        _write_csv(rows, stem + ".csv")  # after every job: a cut-short run keeps its rows

    print("\nsummary (ditfuse eager call; ditfuse-graph: the same call replayed from a CUDA graph):")
    print(f"{'op':20s} {'shape':20s} {'dtype':5s} {'impl':13s} {'us':>9s} {'%copy':>6s} {'x eager':>8s} "
          f"{'x compile':>9s}")
    for r in rows:
        if r["impl"] not in ("ditfuse", "ditfuse-graph"):
            continue
        ref = {x["impl"]: x["us"] for x in rows
               if (x["op"], x["shape"], x["dtype"]) == (r["op"], r["shape"], r["dtype"])}
        xe = ref.get("eager", float("nan")) / r["us"]
        xc = ref.get("compile", float("nan")) / r["us"]
        print(f"{r['op']:20s} {r['shape']:20s} {r['dtype']:5s} {r['impl']:13s} {r['us']:9.1f} {r['pct_copy']:6.1f} "
              f"{xe:8.1f} {xc:9.1f}")
    print(f"csv: {stem}.csv")
    _chart(rows, stem + ".png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
