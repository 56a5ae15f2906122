"""``ditfuse check`` gates of the band attention at SAME-L's shapes."""

from __future__ import annotations

import torch

from ditfuse.norms import NormSpec
from ditfuse.ops.attention import (
    ACCURACY,
    sliding_window_attention,
    sliding_window_attention_reference,
)


@torch.no_grad()
def check_gates(g, device, small: bool):
    """SAME-L attention (24 heads x 64, window 17) against the fp64 dense-mask reference:
    fp32 and bf16; plain, and differential with SAME's prologue (DyT q/k norm, rotate-half
    RoPE over 32 of 64 channels) on views of one packed ``to_qkv`` projection. N = 8704
    (SAME-L decoder, 512 latents) on a GPU, 56 tokens through the interpreter.

    ``g.add(gate, case, ok, detail)``; passes when ``|out - ref| <= ACCURACY[dtype] *
    (|ref| + (1 + lam) rms(v))`` everywhere and the output is finite.
    """
    H, D, W, R = 24, 64, 17, 32
    N = 56 if small else 17 * 512
    for dtype in (torch.float32, torch.bfloat16):
        for diff in (False, True):
            gen = torch.Generator(device=device).manual_seed(1000 * diff + N)
            buf = torch.randn(1, N, 5 * H * D, generator=gen, device=device).to(dtype)
            q1, q2, k1, k2, v = (t.unflatten(-1, (H, D)) for t in buf.chunk(5, -1))
            kw = {}
            if diff:

                def dyt():
                    w = 1 + 0.3 * torch.randn(D, generator=gen, device=device)
                    b = 0.1 * torch.randn(D, generator=gen, device=device)
                    return NormSpec(
                        "dyt",
                        weight=w.to(dtype),
                        bias=b.to(dtype),
                        eps=None,
                        alpha=torch.tensor([0.8], device=device, dtype=dtype),
                    )

                inv = 1.0 / 10000 ** (torch.arange(0, R, 2, device=device, dtype=torch.float32) / R)
                freqs = torch.outer(torch.arange(N, device=device, dtype=torch.float32), inv)
                freqs = torch.cat((freqs, freqs), -1)
                kw = dict(
                    q2=q2,
                    k2=k2,
                    q_norm=dyt(),
                    k_norm=dyt(),
                    cos=freqs.cos(),
                    sin=freqs.sin(),
                    rotary_dim=R,
                )
            out = sliding_window_attention(q1, k1, v, W, **kw)
            ref = sliding_window_attention_reference(
                q1, k1, v, W, compute_dtype=torch.float64, **kw
            )
            o, r = out.double(), ref.double()
            scale = r.abs() + (1 + diff) * v.double().pow(2).mean().sqrt()
            rel = ((o - r).abs() / scale).max().item()
            tol = ACCURACY[dtype]
            finite = bool(torch.isfinite(o).all())
            name = str(dtype).replace("torch.", "")
            case = f"same-l {'diff+dyt+rope' if diff else 'plain'} {name}"
            g.add(
                "swa accuracy",
                case,
                finite and rel <= tol,
                f"N={N} H={H} D={D} w={W} vs fp64 dense mask: err {rel:.2e} of |ref|+rms(v) "
                f"(tol {tol:.2e}, err/tol {rel / tol:.2f}){'' if finite else '; NON-FINITE'}",
            )
            del buf, out, ref, o, r, scale
