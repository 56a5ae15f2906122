"""``ditfuse check``'s gates of the FP8 linears' GEMM (:mod:`ditfuse.ops.gemm_fp8`): for each
shape, the product against its fp64 contract, and the gated residual of its epilogue against
``ditfuse.gated_residual`` of its output, bit for bit.

On an sm_90 GPU the route's persistent Triton kernel at Wan-14B's FFN output projection (two
batch entries, the second starting inside a tile) and Q / K / V / O shapes; on the CPU the same
kernel through Triton's interpreter at a small shape (the route there is ``torch._scaled_mm``,
so the gate calls the kernel's launcher); on other GPUs the route (cuBLASLt, then the residual
kernel).

The bound: the tensor cores' FP8 accumulator keeps fewer bits than fp32, so an element's error
grows with its products' magnitudes, not its result's: every element within 2^-7 of the sum of
|products| plus 2^-7 of the result (its rounding to 16 bits).
"""

from __future__ import annotations

import torch

from ditfuse.ops import gemm_fp8 as G
from ditfuse.ops.adaln import gated_residual
from ditfuse.ops.quantize_rows import quantize_rows, quantize_weight
from ditfuse.reference import gemm_fp8_rows_reference
from ditfuse.runtime import backend

GATE = "FP8 GEMM"
#: (B, S, K, N): B * S tokens x K -> N, the residual (B, S, N)
SMALL_SHAPES = ((2, 150, 256, 272),)
GPU_SHAPES = ((2, 16380, 13824, 5120), (1, 32760, 5120, 5120))
#: the accumulator's bound, a fraction of an element's sum of |products| (and of its result)
BOUND = 2.0**-7


def _shapes(small: bool):
    return SMALL_SHAPES if small else GPU_SHAPES


def planned(small: bool) -> int:
    return 2 * len(_shapes(small))


def _operands(B, S, K, N, device, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(B * S, K, generator=g) * torch.rand(B * S, 1, generator=g) * 3).bfloat16()
    w = (torch.randn(N, K, generator=g) / K**0.5).bfloat16()
    b = torch.randn(N, generator=g).bfloat16().to(device)
    res = (torch.randn(B, S, N, generator=g) * 4).bfloat16().to(device)
    gate = (torch.rand(B, 1, N, generator=g) * 2 - 0.5).to(device)
    q, s = quantize_rows(x.to(device))
    wq, ws = quantize_weight(w.to(device))
    return q, s, wq, ws, b, res, gate


@torch.no_grad()
def check_gates(g, device, small: bool) -> None:
    """Two rows a shape: the product's accuracy, the residual epilogue's bits."""
    kernel = device == "cpu" or backend.INTERPRET  # the kernel itself, not the CPU's route

    def gemm(q, s, wq, ws, b, **residual):
        if kernel:
            out = torch.full((q.shape[0], wq.shape[0]), float("nan"), dtype=torch.bfloat16)
            return G.launch_gemm_fp8_rows(q, s, wq, ws, b, out.to(q.device), **residual)
        r = residual.get("residual")
        return G.gemm_fp8_rows(q, s, wq, ws, b, torch.bfloat16, r, residual.get("gate"))

    for B, S, K, N in _shapes(small):
        case = f"{B * S}x{K}->{N}"
        q, s, wq, ws, b, res, gate = _operands(B, S, K, N, device, seed=K + N)
        route = "Triton" if kernel or G.triton_route(q) else "torch._scaled_mm"
        y = gemm(q, s, wq, ws, b)
        r = gemm_fp8_rows_reference(q, s, wq, ws, b)
        mag = (q.double().abs() @ wq.double().abs().t()) * s.double()[:, None] * ws.double()
        err = (y.double() - r).abs()
        worst = (err / (mag + r.abs())).max().item()
        rel = (err.norm() / r.norm()).item()
        g.add(
            GATE,
            case,
            bool(torch.isfinite(y).all()) and worst <= BOUND,
            f"{route}: max error {worst:.2g} of |products| + |result| (bound 2^-7), "
            f"rel L2 {rel:.2g}",
        )
        del r, mag, err
        fused = gemm(q, s, wq, ws, b, residual=res, gate=gate)
        want = gated_residual(res, y.view(B, S, N), gate)
        same = torch.equal(fused.view(B, S, N), want)
        g.add(
            GATE,
            f"{case} + residual",
            same,
            f"{route}: x + gate * y in the epilogue "
            f"{'bitwise' if same else 'DIFFERS from'} ditfuse.gated_residual after the GEMM",
        )
