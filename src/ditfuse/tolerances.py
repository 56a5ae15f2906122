"""The tolerances of ditfuse's numerical contracts, written once.

The tests, ``ditfuse check`` (``tools/check.py``, ``tools/gn_contract.py``) and the references'
bounds (``reference.py``) read them here. A table maps an activation dtype to its bound; each
says what it bounds and why it has that size. Loosening a value loosens every test and gate
that reads it: a change here is a change of contract.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


class Tol(NamedTuple):
    """``|out - ref| <= rtol |ref| + atol``."""

    rtol: float
    atol: float


# --------------------------------------------------------------------------------------
# Roundings of the activation dtype

#: Unit roundoff (half an ulp, relative) and half the smallest subnormal spacing per dtype:
#: "one rounding" of v is |error| <= u |v| + tiny (the activations' bounds in ``reference``).
UNIT_ROUNDOFF = {
    BF16: Tol(2.0**-8, 2.0**-134),
    FP16: Tol(2.0**-11, 2.0**-25),
    FP32: Tol(2.0**-24, 2.0**-150),
}

#: fp32 evaluation error of the activations (2^-22 = four fp32 units): SwiGLU's
#: x / (1 + exp(-x)) relative; GELU's 1 + tanh / 1 + erf *absolute* (tanhf / erff are
#: 1-2 ulp), times 0.5 |x|, so where 1 + tanh cancels (x below about -3) it exceeds the
#: output's own rounding, in eager PyTorch as well.
ACT_EVAL = 2.0**-22

#: One rounding of each activation dtype, as (rtol, atol): R(v) = rtol |v| + atol (the
#: GroupNorm contract, ``tools/gn_contract.py``). rtol is the spacing of the dtype's values
#: relative to the bottom of a binade (2^-7 bf16, 2^-10 fp16), so R(v) bounds the step
#: between two neighbouring values near v, and the distance between the roundings of two
#: numbers within fp32 arithmetic of each other (two half-spacing errors). In fp32 it is the
#: chains' fp32 arithmetic budget (~17 ulps of 2^-23). atol: a floor for values near 0.
ONE_ROUNDING = {BF16: Tol(2.0**-7, 2.0**-12), FP16: Tol(2.0**-10, 2.0**-14), FP32: Tol(2e-6, 2e-6)}

#: Two roundings of the activation dtype (QK norm + RoPE, AdaLN, activations against their
#: fp64 references): the kernel rounds twice (after the norm, at the store) and the fp64
#: reference rounds at the same points, so a tie flipped by fp32 vs fp64 arithmetic at the
#: first rounding can move the result by one more ulp (relative ulp at the bottom of a
#: binade: 2^-m). The absolute floor covers results that cancel to ~0.
TWO_ROUNDINGS = {BF16: Tol(2.0**-6, 2.0**-12), FP16: Tol(2.0**-9, 2.0**-14), FP32: Tol(2e-6, 2e-6)}

#: One rounding of the activation dtype, relative, against diffusers' eager QK norm + RoPE:
#: the relative ulp is at most 2^-7 (bf16) / 2^-10 (fp16); fp32 differs from diffusers
#: only in the norm's reduction order and rsqrt (last bits of fp32), far inside 1e-5.
DIFFUSERS_QK = {BF16: 2.0**-7, FP16: 2.0**-10, FP32: 1e-5}
#: Floor on the share of elements bitwise equal to diffusers' QK norm + RoPE (half
#: precision: the one rounding hides the fp32 differences almost always). fp32: reported
#: only; a one-ulp difference in a row's rsqrt(mean(x^2)) changes most elements of that row.
DIFFUSERS_QK_MIN_EQUAL = {BF16: 0.99, FP16: 0.99, FP32: 0.0}

#: Share of DyT outputs bitwise equal to diffusers' DynamicTanh module.
DYT_MIN_BITWISE = 0.95

#: Head-parallel QK norm + RoPE (two ranks) against one process: the same up to the order
#: of the sum of squares (two partial sums, then one add).
HEAD_PARALLEL = {FP32: Tol(2e-6, 2e-6), BF16: Tol(2.0**-7, 2.0**-7)}

# --------------------------------------------------------------------------------------
# Attention

#: Sliding-window attention against the fp64 formula, as a share of
#: ``|ref| + (1 + |lam|) rms(v)`` (``ops.attention.ACCURACY``).
ATTENTION = {BF16: 2.0**-7, FP16: 2.0**-10, FP32: 2.0**-8}
#: fp32 at precision="highest" (three-term tf32 products), the same share
#: (``ops.attention.ACCURACY_HIGHEST``).
ATTENTION_HIGHEST = 2.0**-16
#: The fused QK prologue against ``qk_norm_rope`` followed by the kernel without prologue:
#: one rounding apart (rtol; atol in units of 2 rms(v)).
ATTENTION_PROLOGUE_VS_UNFUSED = {FP32: 1e-5, BF16: 2.0**-8}
#: fp32 attention by precision, relative to max |ref| of an fp64 evaluation of the formula:
#: "highest" (three-term tf32 products) and "high" (tf32)
ATTENTION_HIGHEST_REL = 2e-5
ATTENTION_HIGH_REL = 3e-3
#: a window of 0 (each query sees its own key, softmax weight exactly 1): out against v,
#: elementwise relative
ATTENTION_WINDOW0_REL = 1e-6

#: 8-bit attention (int8 Q K^T, e4m3 P V) against float64 on the same inputs, and a whole
#: patched model's output against the unpatched bf16 model: cosine similarity at least
#: this, relative L2 error at most that (docs/attention_fp8.md).
ATTENTION_8BIT_COS_MIN = 0.999
ATTENTION_8BIT_REL_L2_MAX = 0.05
#: the same with e4m3 Q / K (``quantize="fp8"``: 3 fraction bits where int8 keeps ~7)
ATTENTION_8BIT_E4M3_QK_COS_MIN = 0.998
ATTENTION_8BIT_E4M3_QK_REL_L2_MAX = 0.07
#: The 8-bit kernel against its PyTorch emulation (same operands; P rounded to e4m3 against
#: the running rather than the final row max, other summation orders): relative L2 error.
ATTENTION_8BIT_VS_EMULATION = 0.03

# --------------------------------------------------------------------------------------
# Patched models (tiny configs) against the unpatched ones, relative to max |output|

#: A whole model: a few roundings of the activation dtype through the blocks. (``ditfuse
#: check`` asks bf16 for bitwise equality; fp32 at this bound.)
PATCHED_MODEL = {FP32: 1e-5, BF16: 2.0**-6}
#: A VAE decode / encode, every norm -> SiLU pair on the kernels: fp32 the statistics'
#: summation order through the convolutions (TF32 off); 16-bit a pair's one-rounding
#: differences, amplified by the layers after it.
PATCHED_VAE = {FP32: 1e-5, BF16: 0.05, FP16: 0.05}
#: The SAME-L decode (band attention, DyT) of the end-to-end runner's tiny model.
PATCHED_DECODE = {FP32: 5e-3, BF16: 2.0**-5}
#: Context-parallel (Ulysses / ring) Wan block output gathered from the ranks against the
#: one-process output: fp32 max |diff| <= 1e-5 max |ref| (Ulysses is bitwise on the CPU, each
#: head sees the whole sequence; ring re-associates the softmax over the chunks: ~2 ulps).
#: bf16: also PSNR >= 40 dB against max |ref| (``CONTEXT_PARALLEL_MIN_PSNR``; ring rounds each
#: merged attention output to bf16; on GPUs a GEMM over S / world tokens may block
#: differently from one over S).
CONTEXT_PARALLEL = {FP32: 1e-5, BF16: 2e-2}
CONTEXT_PARALLEL_MIN_PSNR = {FP32: None, BF16: 40.0}


def cos_rel(out: torch.Tensor, ref: torch.Tensor) -> tuple:
    """(cosine similarity, relative L2 error) of ``out`` against ``ref``, both flattened and
    in float64: the two numbers the accuracy bounds above are written in."""
    o, r = out.double().flatten(), ref.double().flatten()
    return (o @ r / (o.norm() * r.norm())).item(), ((o - r).norm() / r.norm()).item()
