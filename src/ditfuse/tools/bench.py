"""``ditfuse bench``: time every op at the registry's production shapes on the GPU.

For each (op, shape, dtype), in one run: a copy of the op's bytes, the eager code the
model runs (as diffusers writes it), ``torch.compile`` of that code, ditfuse, and peers
when importable (Liger-Kernel). Times are ``triton.testing.do_bench`` medians on random
data; do_bench zeroes a 256 MB buffer before every call, so no input starts in L2, and
inputs are also rotated over several copies when one set would fit in L2. The copy
ceiling is a 2 GiB device-to-device copy measured in the same run.

Writes ``benchmarks/results/<gpu>-<date>.csv`` (columns op, shape, impl, dtype, us, gbps,
pct_copy, gpu, torch, triton, date; then tflops, x_best_sdpa, x_sage, cos_* / rel_l2_*, note,
filled by the 8-bit attention rows only) and a PNG chart next to it.

``--op attention-fp8``: full attention at the models' shapes (``FULL_ATTN_SHAPES``), compute-
bound, so no bytes model: SDPA with each backend forced, SageAttention, and
cuDNN's FP8 attention (the cudnn frontend's ``sdpa_fp8``, per-tensor e4m3 scales), and
``ditfuse.attention(precision="fp8")`` from 16-bit and from prologue-quantized q / k; CUDA-
graph time, TFLOP/s, speed-ups over the fastest SDPA backend and SageAttention, and accuracy
against float64 on a subset of the output (:func:`bench_attention_fp8`).

``--smoke``: every selected case at a few tokens on the CPU (the interpreter), one wall-clock
call a row: the code paths, not the speed.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import functools
import math
import os
import sys
import time

import torch

from ditfuse.tools.attention_inputs import FAMILIES
from ditfuse.tools.bench_linear import LINEAR_IMPLS, LINEAR_SHAPES, bench_linear_fp8
from ditfuse.tools.shapes import QK_SHAPES
from ditfuse.tools.timing import _median_us, graph_us, speedup, tflops  # noqa: F401 (the sweeps import them here)

L2_BYTES = 60 * 2**20
_DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEFAULT_EXTRA_DTYPE_SHAPES = (
    "wan14b-480p",
    "flux1-1024",
    "flux2-1024",
    "sa3-dit",  # any registry
    "same-l-8704",
    "same-l-trt",
)


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
    if (
        shape.norm != "rms"
        or shape.span != "head"
        or shape.style != "interleaved"
        or shape.form != "bshd"
    ):
        return None
    from ditfuse.tools.workloads import _rope_interleaved

    def f(inp):
        q, k, cos, sin = inp["q"], inp["k"], inp["cos"], inp["sin"]
        qn = LigerRMSNormFunction.apply(
            q, inp["q_norm"].weight, inp["q_norm"].eps, 0.0, "llama", False
        )
        kn = LigerRMSNormFunction.apply(
            k, inp["k_norm"].weight, inp["k_norm"].eps, 0.0, "llama", False
        )
        c, s = cos[None, :, None], sin[None, :, None]
        return _rope_interleaved(qn, c, s), _rope_interleaved(kn, c, s)

    return f


def bench_case(
    op,
    shape_name,
    dtype,
    nbytes,
    make,
    eager,
    fused,
    copy_of,
    ceiling,
    emit,
    impls,
    peers=(),
    device="cuda",
    timer=None,
):
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


def _case(ceiling, emit, impls, device, timer):
    """:func:`bench_case` with a sweep's copy ceiling, row writer, implementations, device
    and timer (``impls=`` in a call: that op's own implementations)."""
    return functools.partial(
        bench_case, ceiling=ceiling, emit=emit, impls=impls, device=device, timer=timer
    )


def _qk_fused(**options):
    """``ditfuse.qk_norm_rope`` with ``options`` on an input set of ``qk_inputs``."""
    import ditfuse

    def fused(s):
        return ditfuse.qk_norm_rope(
            s["q"],
            s["k"],
            s["call_cos"],
            s["call_sin"],
            q_norm=s["q_norm"],
            k_norm=s["k_norm"],
            **options,
            **s["kwargs"],
        )

    return fused


def bench_qk(shape, dtype, ceiling, emit, impls, device="cuda", timer=None):
    from ditfuse.tools.workloads import eager_fn, qk_bytes, qk_inputs

    case = _case(ceiling, emit, impls, device, timer)
    case(
        "qk_norm_rope",
        shape.name,
        dtype,
        qk_bytes(shape, dtype),
        lambda i: qk_inputs(shape, device, dtype, seed=i),
        eager_fn(shape),
        # in place as the patched processor calls it (Wan, HunyuanVideo)
        _qk_fused(inplace=shape.inplace),
        lambda s: (s["q"], s["k"]),
        peers=[("liger", _liger_fn(shape) if "liger" in impls else None)],
    )
    if dtype != torch.float32:
        bench_qk_int8(shape, dtype, ceiling, emit, impls, device, timer)


def bench_qk_int8(shape, dtype, ceiling, emit, impls, device="cuda", timer=None):
    """The quantizing prologue (``quantize="int8"``, what ``patch(attention="fp8")`` runs) at
    one shape: op ``qk_norm_rope_int8``. Floor: Q and K read in 16 bits, written in 8 with a
    4-byte scale a head row, the table as for the 16-bit op. Eager / compile: the model's
    code followed by the same quantization in PyTorch (``quantize_per_token``)."""
    from ditfuse.reference import quantize_per_token
    from ditfuse.tools.workloads import eager_fn, qk_bytes, qk_inputs

    el = torch.empty((), dtype=dtype).element_size()
    n = shape.B * shape.S * shape.H * shape.D
    nbytes = qk_bytes(shape, dtype) - 2 * n * el + 2 * n + 2 * shape.B * shape.S * shape.H * 4
    model = eager_fn(shape)

    def eager(s):
        kw = s["kwargs"]
        layout, heads = kw.get("layout", "bshd"), kw.get("num_heads")
        return [quantize_per_token(t, "int8", layout=layout, num_heads=heads) for t in model(s)]

    case = _case(ceiling, emit, impls, device, timer)
    case(
        "qk_norm_rope_int8",
        shape.name,
        dtype,
        nbytes,
        lambda i: qk_inputs(shape, device, dtype, seed=i),
        eager,
        _qk_fused(quantize="int8"),
        lambda s: (s["q"], s["k"]),
        impls=[i for i in impls if i in ("eager", "compile", "ditfuse", "ditfuse-graph")],
    )


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
    case = _case(ceiling, emit, impls, device, timer)
    case(
        "adaln_modulate",
        shape.name,
        dtype,
        mod_bytes,
        make,
        eager_mod,
        lambda s: ditfuse.adaln_modulate(s["x"], s["shift"], s["scale"], eps=1e-6, rounding=per_op),
        lambda s: (s["x"],),
    )
    case(
        "gated_residual_adaln",
        shape.name,
        dtype,
        res_bytes,
        make,
        eager_res,
        lambda s: ditfuse.gated_residual_adaln(
            s["x"], s["y"], s["gate"], s["shift"], s["scale"], eps=1e-6, rounding=per_op
        ),
        lambda s: (s["x"], s["y"]),
    )
    case(
        "gated_residual",
        shape.name,
        dtype,
        3 * n * el + (n * 4 if shape.per_token else 0),
        make,
        eager_gr,
        lambda s: ditfuse.gated_residual(s["x"], s["y"], s["gate"], rounding=per_op),
        lambda s: (s["x"], s["y"]),
    )


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
        return dict(x=proj[..., shape.offset :])

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

    case = _case(ceiling, emit, impls, device, timer)
    case(shape.op, shape.name, dtype, nbytes, make, eager, fused, lambda s: (s["x"],))


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
    reads = (
        1
        if shape.op == "rms"
        or gn_settings(N, shape.groups, C // shape.groups, sp, c_inner=shape.channels_last).path
        == "fit"
        else 2
    )
    nbytes = (reads + 1) * N * C * sp * el
    pshape = (C,) + (1,) * (len(shape.shape) - 2)

    def make(i):
        g = torch.Generator(device=device).manual_seed(i)
        x = shape.layout((torch.randn(shape.shape, generator=g, device=device) * 2 + 0.5).to(dtype))
        w = (
            torch.randn(pshape if shape.op == "rms" else (C,), generator=g, device=device) * 0.5 + 1
        ).to(dtype)
        b = (
            torch.randn(pshape if shape.op == "rms" else (C,), generator=g, device=device) * 0.2
        ).to(dtype)
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

    case = _case(ceiling, emit, impls, device, timer)
    case(
        "group_norm_silu" if shape.op == "gn" else "rms_norm_silu",
        f"{shape.name}",
        dtype,
        nbytes,
        make,
        eager,
        fused,
        lambda s: (s["x"],),
    )


def attention_copy_parts(parts):
    """The tensors the attention rows' ``copy`` moves (each read and written once): half of
    the (B, N, H, D) projection chunks, rounded up -- as many bytes as the floor counts (the
    n inputs read, the output written: n + 1 tensors' worth; docs/design/end_to_end.md)."""
    return list(parts[: (len(parts) + 1) // 2])


def bench_attention(shape, dtype, ceiling, emit, impls, device="cuda", timer=None):
    """Band (differential) attention: dense-mask SDPA as diffusers' SAME runs it,
    FlexAttention with a sliding-window block mask, and ditfuse. Floor: q/k (both halves when
    differential) and v read once, the output written once.  In fp32 the ``ditfuse`` rows
    multiply in tf32 (``precision="high"``), the ``ditfuse-highest`` rows fp32-accurately (PyTorch's
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
            return F.scaled_dot_product_attention(
                q1, k1, v, attn_mask=mask
            ) - F.scaled_dot_product_attention(q2, k2, v, attn_mask=mask)
        q, k, v = p
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def fused(s, precision="high"):  # fp32: tf32 products (the "ditfuse" rows)
        p = s["parts"]
        if shape.differential:
            q1, q2, k1, k2, v = p
            return ditfuse.sliding_window_attention(q1, k1, v, w, q2=q2, k2=k2, precision=precision)
        q, k, v = p
        return ditfuse.sliding_window_attention(q, k, v, w, precision=precision)

    highest = None
    if dtype == torch.float32:  # PyTorch's default float32 matmul precision: fp32-accurate

        def highest(s):
            return fused(s, "highest")

    flex = None
    if "flex" in impls and device != "cpu":
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        bm = create_block_mask(
            lambda b, h, qi, ki: (qi - ki).abs() <= w, None, None, N, N, device=device
        )
        fa = torch.compile(flex_attention)

        def flex(s):
            p = [t.transpose(1, 2) for t in s["parts"]]
            if shape.differential:
                q1, q2, k1, k2, v = p
                return fa(q1, k1, v, block_mask=bm) - fa(q2, k2, v, block_mask=bm)
            q, k, v = p
            return fa(q, k, v, block_mask=bm)

    case = _case(ceiling, emit, impls, device, timer)
    case(
        "sliding_window_attention",
        shape.name,
        dtype,
        nbytes,
        make,
        eager,
        fused,
        lambda s: attention_copy_parts(s["parts"]),
        impls=impls - {"compile"},
        peers=[("flex", flex), ("ditfuse-highest", highest)],
    )


#: the 8-bit attention rows' implementations, in row order ("sdpa-best" is derived)
ATTN_FP8_IMPLS = (
    "sdpa-cudnn",
    "sdpa-flash",
    "sdpa-efficient",
    "sage",
    "cudnn-fp8",
    "cudnn-fp8-e2e",
    "ditfuse-fp8",
    "ditfuse-fp8-prologue",
)
#: the accuracy subset: query rows evenly spread over the sequence, heads evenly spread
ACCURACY_ROWS, ACCURACY_HEADS = 256, 2
#: cuDNN's FP8 softmax scale: P in [0, 1] stored as e4m3 of 256 P (ditfuse's own P scaling)
CUDNN_FP8_SCALE_S = 256.0


def _short(e: BaseException, n: int = 200) -> str:
    msg = " ".join(str(e).split())
    return f"{type(e).__name__}: {msg[:n]}"


def attention_fp8_methods():
    """(impl, prepare) pairs. ``prepare(q, k, v)`` ((B, S, H, D) inputs) does what is not
    timed and returns ``fn()`` -> the (B, S, H, D) output of one call.

    SDPA: diffusers' call, ``(B, H, S, D)`` views of the (B, S, H, D) projections, one
    backend forced through ``sdpa_kernel``. SageAttention: ``sageattn`` on the (B, S, H, D)
    tensors (``tensor_layout="NHD"``); it subtracts the keys' mean from ``k`` in place, so it
    gets its own copy of k. ditfuse-fp8: ``ditfuse.attention(q, k, v, precision="fp8")`` from
    the 16-bit q / k / v, every quantization in the call. ditfuse-fp8-prologue: q / k
    quantized beforehand by ``ditfuse.qk_norm_rope(q, k, quantize="int8")`` (what the
    patched model's fused prologue hands the attention), V still quantized in the call (the
    Triton kernel)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import ditfuse

    def sdpa(backend):
        def prepare(q, k, v):
            qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))

            def fn():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qt, kt, vt).transpose(1, 2)

            return fn

        return prepare

    def sage(q, k, v):
        import sageattention  # ImportError: the "unavailable" row

        kc = k.clone()
        return lambda: sageattention.sageattn(q, kc, v, tensor_layout="NHD", is_causal=False)

    def fp8(q, k, v):
        return lambda: ditfuse.attention(q, k, v, precision="fp8")

    def fp8_prologue(q, k, v):
        qq = ditfuse.qk_norm_rope(q, k, quantize="int8")
        return lambda: ditfuse.attention(
            qq.q, qq.k, v, precision="fp8", q_scale=qq.q_scale, k_scale=qq.k_scale
        )

    return [
        ("sdpa-cudnn", sdpa(SDPBackend.CUDNN_ATTENTION)),
        ("sdpa-flash", sdpa(SDPBackend.FLASH_ATTENTION)),
        ("sdpa-efficient", sdpa(SDPBackend.EFFICIENT_ATTENTION)),
        ("sage", sage),
        ("cudnn-fp8", cudnn_fp8_prepare(quantize_in_call=False)),
        ("cudnn-fp8-e2e", cudnn_fp8_prepare(quantize_in_call=True)),
        ("ditfuse-fp8", fp8),
        ("ditfuse-fp8-prologue", fp8_prologue),
    ]


def _e4m3_per_tensor(x):
    """(x8, descale): ``x8 = e4m3(x / descale)``, ``descale = amax|x| / 448`` as a (1, 1, 1, 1)
    fp32 tensor (no host sync; an all-zero x gets descale 1)."""
    amax = x.abs().amax().float().reshape(1, 1, 1, 1)
    descale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    return (x.float() / descale).to(torch.float8_e4m3fn), descale


#: (shape, strides, device, O dtype name) -> (graph, handle, tensors, workspace)
_CUDNN_FP8_GRAPHS: dict = {}


def _cudnn_fp8_graph(q8, out_bf16: bool):
    """cuDNN's FP8 SDPA forward graph (cudnn frontend's Python graph API) for e4m3 q / k / v
    of q8's (B, S, H, D) shape and strides, passed as (B, H, S, D) dims with the strides
    permuted; O in the same layout, bf16 or e4m3. Built once per shape; raises where the
    frontend or cuDNN declines."""
    import cudnn  # ImportError: the "unavailable" row

    B, S, H, D = q8.shape
    dims = [B, H, S, D]
    st = [q8.stride(0), q8.stride(2), q8.stride(1), q8.stride(3)]
    key = (tuple(dims), tuple(st), str(q8.device), out_bf16)
    if key in _CUDNN_FP8_GRAPHS:  # a graph, or the exception its build raised
        got = _CUDNN_FP8_GRAPHS[key]
        if isinstance(got, Exception):
            raise got
        return got
    try:
        entry = _build_cudnn_fp8_graph(cudnn, dims, st, D, q8.device, out_bf16)
    except Exception as e:  # noqa: BLE001 -- kept: each input family would build it again
        _CUDNN_FP8_GRAPHS[key] = e
        raise
    _CUDNN_FP8_GRAPHS[key] = entry
    return entry


def _build_cudnn_fp8_graph(cudnn, dims, st, D, device, out_bf16):
    e4m3, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
    handle = cudnn.create_handle()  # the graph lowers on it: no device query of its own
    g = cudnn.pygraph(
        io_data_type=e4m3, intermediate_data_type=f32, compute_data_type=f32, handle=handle
    )
    t = {n: g.tensor(name=n, dim=dims, stride=st, data_type=e4m3) for n in ("q", "k", "v")}
    for n in ("descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"):
        t[n] = g.tensor(name=n, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=f32)
    o, _, amax_s, amax_o = g.sdpa_fp8(
        **t,  # q / k / v and the scales, each under its sdpa_fp8 argument name
        is_inference=True,
        attn_scale=D**-0.5,
        use_causal_mask=False,
        name="sdpa_fp8",
    )
    o.set_output(True).set_dim(dims).set_stride(st).set_data_type(
        cudnn.data_type.BFLOAT16 if out_bf16 else e4m3
    )
    for a in (amax_s, amax_o):
        a.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(f32)
    t.update(o=o, amax_s=amax_s, amax_o=amax_o)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    ws = torch.empty(max(g.get_workspace_size(), 1), dtype=torch.uint8, device=device)
    return cudnn, g, handle, t, ws


def cudnn_fp8_prepare(quantize_in_call: bool):
    """``prepare(q, k, v)`` of cuDNN's FP8 attention (``graph.sdpa_fp8``, the cudnn frontend,
    a bench-only dependency): q / k / v cast to e4m3 with one fp32 descale a tensor
    (amax / 448), P stored as e4m3 of 256 P, fp32 softmax. O is bf16 where cuDNN builds that
    graph, else e4m3 at ``scale_o = 224 / amax|v|`` (|O| <= amax|v|, half of e4m3's range
    spare), dequantized to bf16 in the call (one elementwise pass). ``quantize_in_call``
    False (``cudnn-fp8``): q / k / v quantized beforehand, the call is the graph (the peer
    as a kernel); True (``cudnn-fp8-e2e``): the amax / scale / cast of the bf16 q / k / v is
    timed too (eager PyTorch), what a 16-bit caller pays."""

    def prepare(q, k, v):
        if q.device.type != "cuda":
            raise ImportError("cuDNN FP8 attention needs a CUDA device")
        q8, _ = _e4m3_per_tensor(q)
        note = "O bf16"
        try:
            cudnn, g, handle, t, ws = _cudnn_fp8_graph(q8, out_bf16=True)
        except ImportError:
            raise
        except Exception as e:  # noqa: BLE001 -- no bf16 O here: e4m3 O, dequantized
            try:
                cudnn, g, handle, t, ws = _cudnn_fp8_graph(q8, out_bf16=False)
            except ImportError:
                raise
            except Exception as e2:  # noqa: BLE001
                raise ImportError(
                    f"cuDNN FP8 graph not built: {_short(e2, 160)} (bf16 O: {_short(e, 120)})"
                ) from e2
            note = "O e4m3, dequantized in the call"
        dev = q.device
        scale_s = torch.full((1, 1, 1, 1), CUDNN_FP8_SCALE_S, dtype=torch.float32, device=dev)
        descale_s = 1.0 / scale_s
        one = torch.ones_like(scale_s)
        amax_s, amax_o = torch.empty_like(one), torch.empty_like(one)
        out_bf16 = note == "O bf16"
        pre = None if quantize_in_call else [_e4m3_per_tensor(x) for x in (q, k, v)]

        def fn():
            (q8, dq), (k8, dk), (v8, dv) = pre or [_e4m3_per_tensor(x) for x in (q, k, v)]
            scale_o = one if out_bf16 else 0.5 / dv
            o = torch.empty(
                q.shape, dtype=torch.bfloat16 if out_bf16 else torch.float8_e4m3fn, device=dev
            )
            cudnn.set_stream(handle, torch.cuda.current_stream(dev).cuda_stream)
            g.execute(
                {
                    t["q"]: q8,
                    t["k"]: k8,
                    t["v"]: v8,
                    t["descale_q"]: dq,
                    t["descale_k"]: dk,
                    t["descale_v"]: dv,
                    t["descale_s"]: descale_s,
                    t["scale_s"]: scale_s,
                    t["scale_o"]: scale_o,
                    t["o"]: o,
                    t["amax_s"]: amax_s,
                    t["amax_o"]: amax_o,
                },
                ws,
                handle=handle,
            )
            return o if out_bf16 else (o.float() / scale_o).to(torch.bfloat16)

        fn.note = note
        return fn

    return prepare


def bench_attention_fp8(
    shape,
    dtype,
    ceiling,
    emit,
    impls,
    device="cuda",
    timer=None,
    accuracy_rows=ACCURACY_ROWS,
    accuracy_heads=ACCURACY_HEADS,
):
    """Full attention at one model shape (``FULL_ATTN_SHAPES``): SDPA with each backend
    forced, SageAttention, cuDNN's FP8 attention (from e4m3 q / k / v, and from bf16 with
    the quantization timed), and ditfuse's 8-bit attention from 16-bit and from
    prologue-quantized q / k, on the same inputs.

    Time: ``graph_us`` (one call captured in a CUDA graph, replayed, L2 flushed before every
    replay: GPU time only; do_bench's eager median, noted, for a method a graph cannot
    capture) on random normal q / k / v; TFLOP/s = 4 B H S^2 D / time; the
    speed-ups are over the fastest SDPA backend (also a row of its own, ``sdpa-best``, its
    note naming the backend) and over SageAttention. Accuracy, for every input family of
    ``tools.attention_inputs`` (random normal, RMSNorm'd + RoPE'd q / k, a key offset shared
    by the tokens, sharp softmax, outlier V channels, neighbouring tokens alike): cosine
    similarity and relative L2 error against float64 attention,
    on ``accuracy_heads`` heads x ``accuracy_rows`` query rows spread over the sequence, over
    every key (the same positions of every method's full output). A backend that refuses the
    inputs, an implementation that is not installed or fails: a row with no time and a note
    saying so. ``gbps`` / ``pct_copy`` are NaN: the op is compute-bound (``tflops``).
    ``ceiling`` is unused (the registry runner's signature)."""
    import warnings

    from ditfuse.tools.workloads import (
        ATTN_INPUT_KINDS,
        attention_reference_subset,
        attention_subset,
        full_attention_inputs,
        subset_errors,
    )

    gpu = device != "cpu"

    def timed(fn):
        """(us, note): the CUDA-graph time; where a method cannot be captured, do_bench's
        eager median, saying so."""
        if timer is not None:
            return timer(fn), ""
        try:
            return graph_us(fn), ""
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as e:  # noqa: BLE001
            torch.cuda.synchronize()
            return _median_us(fn), f"timed without a CUDA graph ({_short(e, 120)})"

    methods = [(i, p) for i, p in attention_fp8_methods() if i in impls]
    res = {i: dict(us=float("nan"), note="", acc={}, timing="", info="") for i, _ in methods}
    rows, heads = attention_subset(shape.S, shape.H, accuracy_rows, accuracy_heads, device)
    for kind in ATTN_INPUT_KINDS:
        q, k, v = full_attention_inputs(shape, device, dtype, kind, seed=0)
        ref = attention_reference_subset(q, k, v, rows, heads)
        for impl, prepare in methods:
            r = res[impl]
            if r["note"]:  # refused / unavailable / failed on the first kind
                continue
            fn = out = None
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    with torch.no_grad():
                        fn = prepare(q, k, v)
                        r["info"] = getattr(fn, "note", "")
                        out = fn()
                        r["acc"][kind] = subset_errors(out, ref, rows, heads)
                        out = None
                        if kind == "randn":
                            r["us"], r["timing"] = timed(fn)
                except ImportError as e:
                    r["note"] = f"unavailable: {_short(e)}"
                except torch.cuda.OutOfMemoryError as e:
                    r["note"] = f"OOM ({kind}): {_short(e, 80)}"
                except RuntimeError as e:
                    why = "; ".join(" ".join(str(w.message).split())[:160] for w in caught[:3])
                    refused = impl.startswith("sdpa") and (
                        "No available kernel" in str(e) or "No viable backend" in str(e)
                    )
                    r["note"] = (
                        f"refused: {why or _short(e)}"
                        if refused
                        else f"error ({kind}): {_short(e)}"
                    )
                except Exception as e:  # noqa: BLE001 -- a row saying why, the others still run
                    r["note"] = f"error ({kind}): {_short(e)}"
            fn = out = None
            if gpu:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        q = k = v = ref = None

    sdpa_us = {
        i: r["us"] for i, r in res.items() if i.startswith("sdpa") and math.isfinite(r["us"])
    }
    best = min(sdpa_us, key=sdpa_us.get) if sdpa_us else None
    order = list(res)
    if best is not None:
        res["sdpa-best"] = dict(res[best], note=f"= {best}")
        order.insert(max(n for n, i in enumerate(order) if i.startswith("sdpa")) + 1, "sdpa-best")
    best_us = res[best]["us"] if best else float("nan")
    sage_us = res["sage"]["us"] if "sage" in res else float("nan")
    nan = float("nan")
    for impl in order:
        r = res[impl]
        us = r["us"]
        acc = {
            f"{m}_{kind}": v
            for kind, (c, e) in r["acc"].items()
            for m, v in (("cos", c), ("rel_l2", e))
        }
        emit(
            "attention_fp8",
            shape.name,
            impl,
            dtype,
            us,
            nan,
            nan,
            tflops=tflops(shape.flops, us),
            x_best_sdpa=speedup(best_us, us),
            x_sage=speedup(sage_us, us),
            **{c: acc.get(c, nan) for c in ACCURACY_COLUMNS},
            note="; ".join(x for x in (r["note"], r["timing"], r["info"]) if x),
        )


def _chart(rows, path):
    """One panel per op: % of the copy ceiling per (shape, dtype) and implementation. Bars
    above 150% (copies of inputs small enough to stay in L2) are clipped and labelled. Rows
    without a finite % (the compute-bound 8-bit attention rows) have no bar; the FP8 linear
    rows (compute-bound too) are drawn as their speed-up over the bf16 linear."""
    rows = [
        r
        for r in rows
        if math.isfinite(float(r["pct_copy"])) or math.isfinite(float(r.get("x_bf16", "nan")))
    ]
    if not rows:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # pragma: no cover
        print(f"(no chart: {e})")
        return
    speedup_ops = {"linear_fp8": ("x_bf16", "speed-up over bf16 (cuBLAS)", 2.5, 1.0)}
    ops = list(dict.fromkeys(r["op"] for r in rows))
    impls = [
        i
        for i in ("copy", "ditfuse-graph", "ditfuse", "liger", "flex", "compile", "eager")
        if any(r["impl"] == i for r in rows)
    ]
    impls += [
        i
        for i in dict.fromkeys(r["impl"] for r in rows if r["op"] in speedup_ops)
        if i not in impls
    ]
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {i: palette[n % len(palette)] for n, i in enumerate(impls)}
    widest = max(len({(r["shape"], r["dtype"]) for r in rows if r["op"] == op}) for op in ops)
    fig, axes = plt.subplots(
        len(ops), 1, figsize=(max(8, 0.75 * widest + 2), 3.2 * len(ops)), squeeze=False
    )
    for ax, op in zip(axes[:, 0], ops):
        col, ylabel, top, ref = speedup_ops.get(op, ("pct_copy", "% of copy ceiling", 150, 100))
        keys = list(dict.fromkeys((r["shape"], r["dtype"]) for r in rows if r["op"] == op))
        here = [
            i
            for i in impls
            if any(
                r["impl"] == i and r["op"] == op and math.isfinite(float(r.get(col, "nan")))
                for r in rows
            )
        ]
        w = 0.8 / len(here)
        labelled = set()
        for j, impl in enumerate(here):
            for i, k in enumerate(keys):
                m = [
                    r
                    for r in rows
                    if (r["op"], r["shape"], r["dtype"]) == (op, *k) and r["impl"] == impl
                ]
                if not m:
                    continue
                v = float(m[0].get(col, "nan"))
                if not math.isfinite(v):
                    continue
                x = i + j * w
                ax.bar(
                    x,
                    min(v, top),
                    w,
                    color=colors[impl],
                    label=impl if impl not in labelled else None,
                )
                labelled.add(impl)
                if v > top:
                    ax.text(x, top, f"{v:.0f}", ha="center", va="bottom", fontsize=5, rotation=90)
        ax.set_xticks([i + 0.4 - w / 2 for i in range(len(keys))])
        ax.set_xticklabels([f"{sh}\n{d}" for sh, d in keys], fontsize=6)
        ax.set_ylim(0, top * 1.1)
        ax.axhline(ref, color="k", lw=0.5)
        ax.set_ylabel(ylabel, fontsize=7)
        ax.set_title(op, fontsize=8, loc="left")
        ax.legend(fontsize=6, ncol=len(here), loc="upper right")
    fig.suptitle(f"ditfuse on {rows[0]['gpu']} ({rows[0]['date']}): higher is better", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"chart: {path}")


#: accuracy columns of the 8-bit attention rows: <metric>_<input family>
#: (``tools.attention_inputs.FAMILIES``)
ACCURACY_COLUMNS = tuple(f"{m}_{f}" for f in FAMILIES for m in ("cos", "rel_l2"))
#: the columns of CSVs written before the input families (q / k RMSNorm'd with weights
#: 1 + 0.5 N(0, 1), no RoPE; 2 heads x 2048 query rows): kept so that merged tables keep them
LEGACY_ACCURACY_COLUMNS = ("cos_rmsnorm", "rel_l2_rmsnorm")
#: columns every row has; then columns only some ops fill (empty elsewhere, and in CSVs
#: written before they existed): the 8-bit attention rows' TFLOP/s, speed-ups, accuracy, note
BASE_COLUMNS = [
    "op",
    "shape",
    "impl",
    "dtype",
    "us",
    "gbps",
    "pct_copy",
    "gpu",
    "torch",
    "triton",
    "date",
]
EXTRA_COLUMNS = [
    "tflops",
    "x_best_sdpa",
    "x_sage",
    *ACCURACY_COLUMNS,
    "note",
    *LEGACY_ACCURACY_COLUMNS,
    "x_bf16",
    "cos",
    "rel_l2",
]
COLUMNS = BASE_COLUMNS + EXTRA_COLUMNS
_FORMATS = {
    "tflops": ".1f",
    "x_best_sdpa": ".3f",
    "x_sage": ".3f",
    "x_bf16": ".3f",
    "cos": ".8f",
    "rel_l2": ".4e",
    **{
        c: ".8f" if c.startswith("cos") else ".4e"
        for c in ACCURACY_COLUMNS + LEGACY_ACCURACY_COLUMNS
    },
}


def _write_csv(rows, path):
    import csv

    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow(
                [
                    format(r[c], _FORMATS.get(c, ".2f"))
                    if isinstance(r.get(c), float)
                    else str(r.get(c, ""))
                    for c in COLUMNS
                ]
            )


def _wall_us(fn) -> float:
    """Wall-clock us of one call (``--smoke``: the code paths, not the speed)."""
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e6


def _attention_fp8_summary(rows):
    """The 8-bit attention rows as a table: time, TFLOP/s, speed-ups, accuracy."""
    mine = [r for r in rows if r["op"] == "attention_fp8"]
    if not mine:
        return
    print(
        "\n8-bit attention (time: CUDA graph replay; accuracy vs float64 on "
        f"{ACCURACY_HEADS} heads x {ACCURACY_ROWS} query rows, all keys; cos / rel L2 per "
        "input family):"
    )
    fams = "".join(f" {f:>21s}" for f in FAMILIES)
    print(
        f"{'shape':24s} {'impl':21s} {'us':>10s} {'TFLOP/s':>8s} {'x sdpa':>7s} {'x sage':>7s}"
        f"{fams}  note"
    )
    for r in mine:
        acc = "".join(f" {r[f'cos_{f}']:10.6f}/{r[f'rel_l2_{f}']:10.3e}" for f in FAMILIES)
        print(
            f"{r['shape']:24s} {r['impl']:21s} {r['us']:10.1f} {r['tflops']:8.1f} "
            f"{r['x_best_sdpa']:7.3f} {r['x_sage']:7.3f}{acc}  {r['note']}"
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="ditfuse bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--op",
        default="all",
        choices=[
            "all",
            "qk_norm_rope",
            "adaln",
            "activations",
            "group_norm",
            "attention",
            "attention-fp8",
            "linear-fp8",
        ],
        help="one op family (attention-fp8: full attention, SDPA backends / "
        "SageAttention / ditfuse 8-bit, time and accuracy)",
    )
    ap.add_argument("--shapes", default="all", help="comma-separated registry names, or 'all'")
    ap.add_argument("--dtypes", default="bf16", help="comma-separated: bf16,fp16,fp32")
    ap.add_argument(
        "--extra-dtypes",
        default="fp16,fp32",
        help=f"also time these dtypes at {', '.join(DEFAULT_EXTRA_DTYPE_SHAPES)} "
        "(not for attention-fp8)",
    )
    ap.add_argument(
        "--impls",
        default="copy,eager,compile,ditfuse,ditfuse-graph,liger,flex,"
        "ditfuse-highest," + ",".join(ATTN_FP8_IMPLS) + "," + ",".join(LINEAR_IMPLS),
    )
    ap.add_argument(
        "--out-dir",
        default=None,
        help="where the CSV goes (default benchmarks/results; with --smoke a temporary folder)",
    )
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="on the CPU (Triton's interpreter): every selected case at a few tokens, "
        "one wall-clock call a row -- the code paths, not the speed",
    )
    ap.add_argument(
        "--e2e",
        action="store_true",
        help="whole models (random weights): transformers unpatched/patched x eager/compile "
        "and a 20-step trajectory comparison; SAME-L decode of 1 and 3 minutes",
    )
    ap.add_argument(
        "--fp8",
        action="store_true",
        help="with --e2e: the 8-bit attention rows instead -- unpatched, patched and "
        "patched with attention='fp8', each under torch.compile, time a step and "
        "trajectories against unpatched eager (models: "
        "flux2-1024,wan14b-480p,hunyuan-video-544p,wan14b-720p)",
    )
    ap.add_argument(
        "--linear-fp8",
        action="store_true",
        help="with --e2e --fp8: the FP8 linear rows -- unpatched, attention='fp8', "
        "linear='fp8', both, and torchao's float8 per-row linears as the peer",
    )
    ap.add_argument(
        "--linear-sensitivity",
        action="store_true",
        help="with --e2e: per-class and per-layer accuracy of FP8 block linears (eager "
        "trajectories and one step against the unpatched model; each FP8 linear against its "
        "16-bit weight in the model), default model wan14b-480p",
    )
    ap.add_argument(
        "--ways",
        default=None,
        help="with --e2e --fp8 --linear-fp8: comma-separated labels of the ways to run "
        "after the unpatched baseline (default all: 'patched,patched fp8,patched "
        "linear-fp8,patched fp8 + linear-fp8,torchao linear-fp8,patched fp8 + torchao "
        "linear-fp8'); each is a compile",
    )
    ap.add_argument(
        "--kernels",
        action="store_true",
        help="with --e2e: after the timing rounds, profile one call of each transformer way "
        "and end its note with the kernel time by class (attention, GEMM, other)",
    )
    ap.add_argument(
        "--models",
        default="all",
        help="with --e2e: comma-separated, from wan14b-480p,wan14b-720p,flux1-1024,"
        "flux2-1024,qwen-image-1328,hunyuan-video-544p,same-l",
    )
    ap.add_argument(
        "--no-compile", action="store_true", help="with --e2e: skip the torch.compile rows"
    )
    ap.add_argument(
        "--layers",
        type=int,
        default=None,
        help="with --e2e: double-stream blocks (default 2; with --fp8 Wan 4, "
        "FLUX.2 / HunyuanVideo 1, i.e. 1 + 2 single)",
    )
    ap.add_argument("--steps", type=int, default=20, help="with --e2e: trajectory steps")
    ap.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="with --e2e: interleaved timing rounds (default 5; with --fp8 2)",
    )
    args = ap.parse_args(argv)
    if args.kernels and not args.e2e:
        print("ditfuse bench: --kernels goes with --e2e", file=sys.stderr)
        return 2
    if args.e2e:
        if args.linear_sensitivity:
            from ditfuse.tools.linear_sensitivity import main as sensitivity_main

            return sensitivity_main(args)
        from ditfuse.tools.e2e import main as e2e_main

        return e2e_main(args)
    if not torch.cuda.is_available() and not args.smoke:
        print(
            "ditfuse bench: no CUDA GPU here; benchmarks need one (use `ditfuse check` on the CPU, "
            "or `ditfuse bench --smoke` for the code paths)",
            file=sys.stderr,
        )
        return 2
    import triton

    from ditfuse.tools.shapes import (
        ACT_SHAPES,
        ADALN_SHAPES,
        ATTN_SHAPES,
        FULL_ATTN_SHAPES,
        GN_SHAPES,
    )

    registries = {
        "qk_norm_rope": (QK_SHAPES, bench_qk),
        "adaln": (ADALN_SHAPES, bench_adaln),
        "activations": (ACT_SHAPES, bench_activation),
        "group_norm": (GN_SHAPES, bench_group_norm),
        "attention": (ATTN_SHAPES, bench_attention),
        "attention-fp8": (FULL_ATTN_SHAPES, bench_attention_fp8),
        "linear-fp8": (LINEAR_SHAPES, bench_linear_fp8),
    }
    ops = list(registries) if args.op == "all" else [args.op]
    jobs = []
    for op in ops:
        reg, _ = registries[op]
        names = (
            list(reg) if args.shapes == "all" else [n for n in args.shapes.split(",") if n in reg]
        )
        if args.shapes != "all":
            unknown = [
                n for n in args.shapes.split(",") if not any(n in registries[o][0] for o in ops)
            ]
            if unknown:
                print(
                    f"unknown shape(s) {unknown}; known: "
                    f"{', '.join(n for o in ops for n in registries[o][0])}",
                    file=sys.stderr,
                )
                return 2
        dtypes = args.dtypes.split(",")
        if op in ("attention-fp8", "linear-fp8"):  # 16-bit inputs only
            jobs += [(op, n, d) for d in dtypes if d in ("bf16", "fp16") for n in names]
            continue
        jobs += [(op, n, d) for d in dtypes for n in names]
        if args.extra_dtypes:
            jobs += [
                (op, n, d)
                for d in args.extra_dtypes.split(",")
                for n in DEFAULT_EXTRA_DTYPE_SHAPES
                if n in names and (op, n, d) not in jobs
            ]
    impls = set(args.impls.split(","))
    date = _dt.date.today().isoformat()
    if args.smoke:
        device, timer, ceiling, gpu = "cpu", _wall_us, float("nan"), "cpu-smoke"
        impls -= {"compile", "flex", "liger", "ditfuse-graph"}
        out_dir = args.out_dir or __import__("tempfile").mkdtemp(prefix="ditfuse-bench-smoke-")
        from ditfuse.runtime.backend import INTERPRET

        print(
            f"smoke run on the CPU (ditfuse's kernels interpreted: {INTERPRET}): a few tokens a "
            f"case, wall-clock times of one call"
        )
    else:
        device, timer, out_dir = "cuda", None, args.out_dir or "benchmarks/results"
        torch._dynamo.config.cache_size_limit = 256
        gpu = torch.cuda.get_device_name()
        ceiling = copy_ceiling_gbps()
        print(
            f"{gpu}: copy ceiling {ceiling:.0f} GB/s (2 GiB device-to-device); torch "
            f"{torch.__version__}, triton {triton.__version__}"
        )
    print(
        f"{'op':20s} {'shape':20s} {'dtype':5s} {'impl':13s} {'us':>10s} {'GB/s':>8s} {'%copy':>6s}"
    )
    rows = []

    def emit(op, shape, impl, dtype, us, gbps, pct, **extra):
        dname = {v: k for k, v in _DT.items()}[dtype]
        rows.append(
            dict(
                op=op,
                shape=shape,
                impl=impl,
                dtype=dname,
                us=us,
                gbps=gbps,
                pct_copy=pct,
                gpu=gpu,
                torch=torch.__version__,
                triton=triton.__version__,
                date=date,
                **extra,
            )
        )
        line = f"{op:20s} {shape:20s} {dname:5s} {impl:13s} {us:10.1f} {gbps:8.0f} {pct:6.1f}"
        if "x_bf16" in extra:  # the FP8 linear rows: TFLOP/s, speed-up over bf16, accuracy
            line += (
                f" {extra['tflops']:7.1f} TFLOP/s x{extra['x_bf16']:.3f} bf16; cos "
                f"{extra['cos']:.6f}, rel L2 {extra['rel_l2']:.2e} {extra['note']}"
            )
        elif extra:  # the 8-bit attention rows: TFLOP/s, speed-ups, accuracy
            line += (
                f" {extra['tflops']:7.1f} TFLOP/s x{extra['x_best_sdpa']:.3f} sdpa "
                f"x{extra['x_sage']:.3f} sage; cos "
                + " / ".join(f"{extra[f'cos_{f}']:.6f}" for f in FAMILIES)
                + ", rel L2 "
                + " / ".join(f"{extra[f'rel_l2_{f}']:.2e}" for f in FAMILIES)
                + f" ({' / '.join(FAMILIES)}) {extra['note']}"
            )
        print(line, flush=True)

    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"{gpu.replace(' ', '-')}-{date}")
    t0 = time.time()
    for i, (op, n, d) in enumerate(jobs):
        print(f"[{i + 1}/{len(jobs)}] {op} {n} {d} ({time.time() - t0:.0f} s)", flush=True)
        reg, fn = registries[op]
        if args.smoke:
            fn(reg[n].small(), _DT[d], ceiling, emit, impls, device=device, timer=timer)
        else:
            fn(reg[n], _DT[d], ceiling, emit, impls)
            torch.cuda.empty_cache()
        _write_csv(rows, stem + ".csv")  # after every job: a cut-short run keeps its rows

    print(
        "\nsummary (ditfuse eager call; ditfuse-graph: the same call replayed from a CUDA graph):"
    )
    print(
        f"{'op':20s} {'shape':20s} {'dtype':5s} {'impl':13s} {'us':>9s} {'%copy':>6s} "
        f"{'x eager':>8s} "
        f"{'x compile':>9s}"
    )
    for r in rows:
        if r["impl"] not in ("ditfuse", "ditfuse-graph"):
            continue
        ref = {
            x["impl"]: x["us"]
            for x in rows
            if (x["op"], x["shape"], x["dtype"]) == (r["op"], r["shape"], r["dtype"])
        }
        xe = ref.get("eager", float("nan")) / r["us"]
        xc = ref.get("compile", float("nan")) / r["us"]
        print(
            f"{r['op']:20s} {r['shape']:20s} {r['dtype']:5s} {r['impl']:13s} {r['us']:9.1f} "
            f"{r['pct_copy']:6.1f} "
            f"{xe:8.1f} {xc:9.1f}"
        )
    _attention_fp8_summary(rows)
    print(f"csv: {stem}.csv ({time.time() - t0:.0f} s)")
    _chart(rows, stem + ".png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
