"""``ditfuse bench --op linear-fp8``: the DiTs' block linears, bf16 against FP8.

Rows per shape (``LINEAR_SHAPES``: tokens x in_features -> out_features of a model's block),
each the CUDA-graph time of one call (L2 flushed before every replay):

- ``bf16``: ``F.linear`` (cuBLAS) of the 16-bit activation, with bias;
- ``ditfuse-fp8``: :func:`ditfuse.ops.linear_fp8.linear_fp8` from the same 16-bit activation
  (the per-token quantization included) and the patch-time e4m3 weight;
- ``ditfuse-fp8-gemm``: its GEMM alone (:func:`ditfuse.ops.gemm_fp8.gemm_fp8_rows`: the
  persistent Triton kernel on sm_90) on operands quantized beforehand (what the layer costs
  where the kernel before it writes the e4m3 activation);
- ``cublaslt-fp8-gemm``: ``torch._scaled_mm`` with row-wise scales (cuBLASLt) on the same
  operands, the GEMM torchao calls;
- ``quantize``: :func:`~ditfuse.ops.linear_fp8.quantize_rows` alone (GB/s and % of the copy
  ceiling: it reads 2 and writes 1 byte an element);
- at an FFN's output projection (``gelu`` shapes) ``bf16-gelu`` (the GELU as the model runs it
  plus the linear) against ``ditfuse-fp8-gelu`` (the GELU in the quantizing pass); and the
  block's gated residual after it (Wan's: one batch entry, an fp32 gate row):
  ``ditfuse-fp8-gelu-residual-after`` (``ditfuse.gated_residual`` after the layer) against
  ``ditfuse-fp8-gelu-residual`` (``linear_fp8(..., residual=, gate=)``: in the GEMM's
  epilogue on sm_90), whose ``x_bf16`` is its speed-up over the form after;
- at a linear whose input is an AdaLN modulation's output (``adaln`` shapes: Wan's fused
  Q / K / V and FFN input) ``bf16-adaln`` (ditfuse's 16-bit AdaLN kernel plus the linear)
  against ``ditfuse-fp8-adaln`` (the AdaLN kernel writing the e4m3 rows and their scales,
  ``quantize="fp8"``, plus the GEMM): the layer as the patched Wan block runs it;
- at an attention's output projection (``heads`` shapes: Wan's Q / K / V / O)
  ``attention-16bit-out`` and ``attention-e4m3-out``: the 8-bit attention of the projection's
  ``M`` queries over ``ATTN_KEYS`` keys, writing its output in 16 bits or as e4m3 rows with
  their scales (``quantize_out="fp8"``) -- the output format changes the epilogue and V's
  amax pass, whose cost does not grow with the keys, so few keys measure it apart from the
  key loop's run-to-run spread; and ``ditfuse-fp8-attn``: the projection's GEMM on those
  rows plus that difference where positive, against ``bf16`` -- the layer as the patched
  Wan block runs it;
- ``torchao``: torchao's ``Float8DynamicActivationFloat8WeightConfig(PerRow())`` on an
  ``nn.Linear``, under ``torch.compile`` (the peer users have; a note where not installed).

Accuracy of every FP8 row against the fp64 linear of the 16-bit operands: cosine and
relative L2 over every element (``cos`` / ``rel_l2``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from ditfuse.tolerances import cos_rel
from ditfuse.tools.shapes import by_name
from ditfuse.tools.timing import graph_or_eager_us, speedup, tflops


@dataclass(frozen=True)
class LinearShape:
    name: str
    model: str
    M: int  # tokens
    K: int  # in_features
    N: int  # out_features
    gelu: bool = False  # the FFN's output projection: its input is a tanh GELU's output
    adaln: bool = False  # its input is an AdaLN modulation's output (LayerNorm, shift, scale)
    heads: int = 0  # its input is a self-attention's output of this many heads (M tokens)

    def small(self, M: int = 32) -> "LinearShape":
        return replace(self, M=min(M, self.M), K=min(self.K, 256), N=min(self.N, 128))

    @property
    def flops(self) -> float:
        return 2.0 * self.M * self.K * self.N


def _wan14b_linears(res: str, M: int) -> list:
    """Wan2.x 14B's block linears at ``res`` (``M`` tokens): Q / K / V / O, the fused QKV,
    the FFN's input and output projections."""
    return [
        LinearShape(
            f"wan14b-{res}-qkvo", f"Wan2.x 14B {res}: Q / K / V / O", M, 5120, 5120, heads=40
        ),
        LinearShape(
            f"wan14b-{res}-qkv-fused",
            f"Wan2.x 14B {res}: Q K V fused (linear='fp8')",
            M,
            5120,
            3 * 5120,
            adaln=True,
        ),
        LinearShape(
            f"wan14b-{res}-ffn-in", f"Wan2.x 14B {res}: FFN in", M, 5120, 13824, adaln=True
        ),
        LinearShape(f"wan14b-{res}-ffn-out", f"Wan2.x 14B {res}: FFN out", M, 13824, 5120, True),
    ]


LINEAR_SHAPES = by_name(
    *_wan14b_linears("480p", 21 * 30 * 52),
    *_wan14b_linears("720p", 21 * 45 * 80),
    LinearShape(
        "flux2-1024-qkv", "FLUX.2-dev 1024^2: fused QKV + MLP in (single)", 4608, 6144, 55296
    ),
    LinearShape(
        "hunyuan-video-544p-ffn-out",
        "HunyuanVideo 544p: FFN out",
        33 * 34 * 60,
        12288,
        3072,
        True,
    ),
)

LINEAR_IMPLS = (
    "bf16",
    "ditfuse-fp8",
    "ditfuse-fp8-gemm",
    "cublaslt-fp8-gemm",
    "quantize",
    "bf16-gelu",
    "ditfuse-fp8-gelu",
    "ditfuse-fp8-gelu-residual-after",
    "ditfuse-fp8-gelu-residual",
    "bf16-adaln",
    "ditfuse-fp8-adaln",
    "attention-16bit-out",
    "attention-e4m3-out",
    "ditfuse-fp8-attn",
    "torchao",
)
#: the rows of an attention's output projection; the keys its attention rows attend
ATTN_KEYS = 1024
_ATTN_IMPLS = ("attention-16bit-out", "attention-e4m3-out", "ditfuse-fp8-attn")


def _torchao_linear(w, b):
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_

    lin = torch.nn.Linear(w.shape[1], w.shape[0], device=w.device, dtype=w.dtype)
    with torch.no_grad():
        lin.weight.copy_(w)
        lin.bias.copy_(b)
    quantize_(lin, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()))
    return torch.compile(lin)


def bench_linear_fp8(shape: LinearShape, dtype, ceiling, emit, impls, device="cuda", timer=None):
    """The rows of the module docstring for one shape; ``timer`` (us of a callable) defaults
    to the CUDA-graph timer."""
    from ditfuse.ops.gemm_fp8 import gemm_fp8_rows, scaled_mm_rows, triton_route
    from ditfuse.ops.linear_fp8 import linear_fp8, quantize_rows, quantize_weight

    timer = timer or graph_or_eager_us
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(shape.M, shape.K, generator=g).to(device, dtype)
    w = (torch.randn(shape.N, shape.K, generator=g) / math.sqrt(shape.K)).to(device, dtype)
    b = torch.randn(shape.N, generator=g).to(device, dtype)
    wq, ws = quantize_weight(w)
    nan = float("nan")
    with torch.no_grad():
        ref = F.linear(x.double(), w.double(), b.double())
        base_us = timer(lambda: F.linear(x, w, b)) if "bf16" in impls else nan

        def row(impl, us, y=None, gbps=nan, pct=nan, note="", against=None, base=None):
            """One row: ``y`` against ``against`` (default: the fp64 linear), ``us`` against
            ``base`` (default: the bf16 row's time)."""
            cos, rel = (
                cos_rel(y, against if against is not None else ref) if y is not None else (nan, nan)
            )
            emit(
                "linear_fp8",
                shape.name,
                impl,
                dtype,
                us,
                gbps,
                pct,
                tflops=tflops(shape.flops, us),
                x_bf16=speedup(base_us if base is None else base, us),
                cos=cos,
                rel_l2=rel,
                note=note,
            )

        if "bf16" in impls:
            row("bf16", base_us, note="cuBLAS F.linear")
        if "ditfuse-fp8" in impls:
            row(
                "ditfuse-fp8",
                timer(lambda: linear_fp8(x, wq, ws, b)),
                linear_fp8(x, wq, ws, b),
                note="per-token quantization included",
            )
        q, s = quantize_rows(x)
        if "ditfuse-fp8-gemm" in impls:
            route = "Triton persistent" if triton_route(q) else "torch._scaled_mm"
            row(
                "ditfuse-fp8-gemm",
                timer(lambda: gemm_fp8_rows(q, s, wq, ws, b, dtype)),
                gemm_fp8_rows(q, s, wq, ws, b, dtype),
                note=f"GEMM alone ({route}), activation quantized beforehand",
            )
        if "cublaslt-fp8-gemm" in impls:
            row(
                "cublaslt-fp8-gemm",
                timer(lambda: scaled_mm_rows(q, s, wq, ws, b, dtype)),
                scaled_mm_rows(q, s, wq, ws, b, dtype),
                note="torch._scaled_mm row-wise (cuBLASLt), same operands",
            )
        if "quantize" in impls:
            us = timer(lambda: quantize_rows(x))
            gbps = (x.numel() * (x.element_size() + 1) + 4 * shape.M) / (us * 1e3)
            emit(
                "linear_fp8",
                shape.name,
                "quantize",
                dtype,
                us,
                gbps,
                100 * gbps / ceiling,
                tflops=nan,
                x_bf16=nan,
                cos=nan,
                rel_l2=nan,
                note="per-token e4m3 quantization alone",
            )
        q = s = None
        if shape.gelu and any(i.startswith(("bf16-gelu", "ditfuse-fp8-gelu")) for i in impls):
            ref_g = F.linear(F.gelu(x.double(), approximate="tanh"), w.double(), b.double())
            us16 = timer(lambda: F.linear(F.gelu(x, approximate="tanh"), w, b))
            if "bf16-gelu" in impls:
                row(
                    "bf16-gelu",
                    us16,
                    base=us16,
                    note="F.gelu(tanh) + cuBLAS F.linear (x_bf16 of the "
                    "ditfuse-fp8-gelu row against this one)",
                )
            if "ditfuse-fp8-gelu" in impls:
                row(
                    "ditfuse-fp8-gelu",
                    timer(lambda: linear_fp8(x, wq, ws, b, activation="gelu_tanh")),
                    linear_fp8(x, wq, ws, b, activation="gelu_tanh"),
                    against=ref_g,
                    base=us16,
                    note="GELU in the quantizing pass; against bf16-gelu",
                )
            if any(i.startswith("ditfuse-fp8-gelu-residual") for i in impls):
                _residual_rows(x, wq, ws, b, ref_g, impls, timer, row)
        if shape.adaln and ("bf16-adaln" in impls or "ditfuse-fp8-adaln" in impls):
            _adaln_rows(x, w, b, wq, ws, impls, timer, row)
        if shape.heads and device != "cpu" and any(i in impls for i in _ATTN_IMPLS):
            _attention_rows(shape, dtype, wq, ws, b, w, base_us, impls, timer, emit, row)
        if "torchao" in impls and device != "cpu":
            try:
                lin = _torchao_linear(w, b)
                lin(x)
                row(
                    "torchao",
                    timer(lambda: lin(x)),
                    lin(x),
                    note="torchao Float8DynamicActivationFloat8WeightConfig(PerRow) + compile",
                )
            except Exception as e:  # noqa: BLE001 -- a row saying why, the others still run
                row("torchao", nan, note=f"unavailable: {type(e).__name__}: {str(e)[:120]}")


def _residual_rows(x, wq, ws, b, ref_g, impls, timer, row):
    """The ``ditfuse-fp8-gelu-residual(-after)`` rows: the FFN output projection of ``x``
    (GELU fused) and Wan's gated residual ``res + ffn * gate`` (one batch entry of M tokens,
    an fp32 gate row), after the layer and in its GEMM."""
    from ditfuse.ops.adaln import gated_residual
    from ditfuse.ops.linear_fp8 import linear_fp8

    M, N = x.shape[0], wq.shape[0]
    g = torch.Generator(device="cpu").manual_seed(1)
    res = torch.randn(1, M, N, generator=g).to(x.device, x.dtype)
    gate = (torch.rand(1, 1, N, generator=g) * 2 - 0.5).to(x.device)
    ref = res.double() + ref_g.view(1, M, N) * gate.double()

    def after():
        y = linear_fp8(x, wq, ws, b, activation="gelu_tanh")
        return gated_residual(res, y.view(1, M, N), gate)

    def fused():
        return linear_fp8(
            x.view(1, M, -1), wq, ws, b, activation="gelu_tanh", residual=res, gate=gate
        )

    us_after = timer(after)
    if "ditfuse-fp8-gelu-residual-after" in impls:
        row(
            "ditfuse-fp8-gelu-residual-after",
            us_after,
            after(),
            against=ref,
            base=us_after,
            note="GELU-fused layer, then ditfuse.gated_residual (fp32 gate row)",
        )
    if "ditfuse-fp8-gelu-residual" in impls:
        row(
            "ditfuse-fp8-gelu-residual",
            timer(fused),
            fused(),
            against=ref,
            base=us_after,
            note="the gated residual in the layer's GEMM; x_bf16: against the form after",
        )


def _adaln_rows(x, w, b, wq, ws, impls, timer, row):
    """The ``bf16-adaln`` / ``ditfuse-fp8-adaln`` rows: Wan's norm + modulation of ``x`` (one
    batch entry, fp32 shift and scale) before the linear."""
    from ditfuse.ops.adaln import adaln_modulate
    from ditfuse.ops.linear_fp8 import linear_fp8

    g = torch.Generator(device="cpu").manual_seed(1)
    shift, scale = (torch.randn(1, x.shape[1], generator=g).to(x.device) for _ in range(2))
    x3 = x[None]

    def mod(**kw):
        return adaln_modulate(x3, shift, scale, norm="layer", eps=1e-6, **kw)

    ref_a = F.linear(mod()[0].double(), w.double(), b.double())
    us16 = timer(lambda: F.linear(mod(), w, b))
    if "bf16-adaln" in impls:
        row(
            "bf16-adaln",
            us16,
            base=us16,
            note="ditfuse AdaLN (16-bit output) + cuBLAS F.linear (x_bf16 of the "
            "ditfuse-fp8-adaln row against this one)",
        )
    if "ditfuse-fp8-adaln" in impls:
        row(
            "ditfuse-fp8-adaln",
            timer(lambda: linear_fp8(mod(quantize="fp8"), wq, ws, b)),
            linear_fp8(mod(quantize="fp8"), wq, ws, b)[0],
            against=ref_a,
            base=us16,
            note="AdaLN writes the e4m3 rows + scales (quantize='fp8'), then the GEMM; "
            "against bf16-adaln",
        )


def _attention_rows(shape, dtype, wq, ws, b, w, base_us, impls, timer, emit, row):
    """The ``attention-16bit-out`` / ``attention-e4m3-out`` / ``ditfuse-fp8-attn`` rows: one
    batch entry's 8-bit attention of ``shape.M`` queries over ``ATTN_KEYS`` keys (random Q /
    K / V), then the output projection on its output."""
    import ditfuse
    from ditfuse.ops.linear_fp8 import linear_fp8

    H = shape.heads
    D = shape.K // H
    g = torch.Generator(device="cpu").manual_seed(2)
    q, k, v = (
        torch.randn(1, S, H, D, generator=g).to(w.device, dtype)
        for S in (shape.M, ATTN_KEYS, ATTN_KEYS)
    )
    flops = 4.0 * shape.M * ATTN_KEYS * H * D
    nan = float("nan")

    def attn(**kw):
        return ditfuse.attention(q, k, v, precision="fp8", **kw)

    us = {}
    for impl, kw, note in (
        ("attention-16bit-out", {}, "8-bit self-attention, 16-bit output"),
        (
            "attention-e4m3-out",
            dict(quantize_out="fp8"),
            "8-bit self-attention, e4m3 rows + a scale a token (quantize_out='fp8')",
        ),
    ):
        us[impl] = timer(lambda: attn(**kw))
        if impl in impls:
            emit(
                "linear_fp8",
                shape.name,
                impl,
                dtype,
                us[impl],
                nan,
                nan,
                tflops=tflops(flops, us[impl]),
                x_bf16=nan,
                cos=nan,
                rel_l2=nan,
                note=f"{note}: (1, {shape.M}, {H}, {D}) queries, {ATTN_KEYS} keys",
            )
    if "ditfuse-fp8-attn" in impls:
        rows8 = attn(quantize_out="fp8")
        x = attn().flatten(2)
        extra = max(0.0, us["attention-e4m3-out"] - us["attention-16bit-out"])
        # accuracy without the bias: the attention's output is ~0.03 rms over 1,024 random
        # keys, the bias N(0, 1), which would hide the product's error
        row(
            "ditfuse-fp8-attn",
            timer(lambda: linear_fp8(rows8, wq, ws, b)) + extra,
            linear_fp8(rows8, wq, ws),
            against=F.linear(x.double(), w.double()),
            note=f"GEMM on the attention's e4m3 rows + {extra:.1f} us the e4m3 output added to "
            "the attention (0 where it saved time); accuracy of the product (no bias) against "
            "the fp64 product of its 16-bit output",
        )
