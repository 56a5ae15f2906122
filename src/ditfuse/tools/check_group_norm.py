"""``ditfuse check`` gates of GroupNorm + SiLU and the channel RMS norm at the VAE shapes."""

from __future__ import annotations

import dataclasses
import math
import zlib

import torch

from ditfuse.ops.group_norm import gn_settings, group_norm_silu, rms_norm_silu_channels
from ditfuse.reference import group_norm_silu_chain, rms_norm_silu_channels_chain
from ditfuse.tools.gn_contract import _eager_gn_rounds_stats, eager_gn_stat_steps, parity
from ditfuse.tools.shapes import GN_SHAPES, GNShape


def _eager_chain(s: GNShape, x, w, b, eps):
    """The models' own eager code: torch GroupNorm -> SiLU, or diffusers' WanRMS_norm -> SiLU."""
    F = torch.nn.functional
    if s.op == "gn":
        return F.silu(F.group_norm(x, s.groups, w, b, eps))
    shape = (s.C,) + (1,) * (x.dim() - 2)
    half = x.dtype in (torch.float16, torch.bfloat16)
    normed = F.normalize(x.float() if half else x, dim=1).to(x.dtype)  # as WanRMS_norm.forward
    bias = 0.0 if b is None else b.reshape(shape)
    return F.silu(normed * (s.C**0.5) * w.reshape(shape) + bias)


@torch.no_grad()
def check_gates(gates, device, small: bool, dtypes=None, shapes=None):
    """Parity gates of group_norm_silu / rms_norm_silu_channels at the VAE shapes.

    For each shape and dtype, the kernel against (1) the fp64 reference that rounds where the
    kernel rounds: within the contract (:func:`contract_tolerance`) and, in half precision,
    with at most :func:`differ_limit` of its elements differing from it; (2) the models'
    eager chain (which rounds at the same points): within the same contract, widened by
    eager's own rounding of the GroupNorm statistics where torch makes it
    (``_eager_gn_rounds_stats``; the share of differing elements is then not gated, else
    twice the fp64 limit: both sides compute in fp32). The rows report the error over the
    contract, over one output rounding alone, and the shares of bitwise-equal and differing
    elements. ``gates.add(gate, case, ok, detail)`` as in :mod:`ditfuse.tools.check`.
    """
    if dtypes is None:
        dtypes = (
            [torch.bfloat16, torch.float16, torch.float32]
            if small
            else [torch.bfloat16, torch.float32]
        )
    if shapes is None:
        shapes = (
            [s for s in GN_SHAPES.values() if not s.channels_last]
            if small
            else [
                GN_SHAPES[n]
                for n in (
                    "flux-vae-mid-128",
                    "flux-vae-out-1024",
                    "hunyuan-vae-mid",
                    "hunyuan-vae-up-9f",
                    "wan-vae-mid-480p",
                    "wan-vae-out-480p",
                    "flux-vae-up1-256-cl",
                    "flux-vae-out-1024-cl",
                )
            ]
        )
        if not small:  # a shape whose groups fit one program (the fit path) on the GPU too
            shapes.append(
                GNShape("flux-vae-mid-32", "AutoencoderKL mid block, 256^2", (1, 512, 32, 32))
            )
    runs = [(s.small() if small else s, None) for s in shapes]
    if small:  # interpreter-sized groups all fit: force the split paths on one of them too
        first = next((s for s, _ in runs if s.op == "gn"), None)
        if first is not None:
            runs.append((first, dict(fit_max=0, tile=256)))
            runs.append(
                (
                    dataclasses.replace(first, name=first.name + "-cl", channels_last=True),
                    dict(fit_max=0, tile=256),
                )
            )
    for s, launch in runs:
        for dtype in dtypes:
            gen = torch.Generator(device=device).manual_seed(zlib.crc32(s.name.encode()))
            x = s.layout((torch.randn(s.shape, generator=gen, device=device) * 2 + 0.5).to(dtype))
            pshape = (s.C,) if s.op == "gn" else (s.C,) + (1,) * (len(s.shape) - 2)
            w = (torch.randn(pshape, generator=gen, device=device) * 0.5 + 1).to(dtype)
            b = (torch.randn(pshape, generator=gen, device=device) * 0.2).to(dtype)
            extra, note = [], ""
            if s.op == "gn":
                eps = 1e-6
                y = group_norm_silu(x, s.groups, w, b, eps, _launch=launch)
                chain = group_norm_silu_chain(x, s.groups, w, b, eps, compute_dtype=torch.float64)
                path = gn_settings(
                    s.shape[0],
                    s.groups,
                    s.C // s.groups,
                    math.prod(s.shape[2:]),
                    c_inner=s.channels_last,
                    **(launch or {}),
                ).path
                if _eager_gn_rounds_stats(device, dtype):
                    extra = eager_gn_stat_steps(chain, x, w)
                    note = f" (eager rounds mean/rstd to {str(dtype)[6:]})"
            else:
                eps = 1e-12
                b = None  # WanRMS_norm(bias=False), as in the Wan VAE
                y = rms_norm_silu_channels(x, w, b, eps)
                chain = rms_norm_silu_channels_chain(x, w, b, eps, compute_dtype=torch.float64)
                path = "rms"
            eager = _eager_chain(s, x, w, b, eps)
            p = parity(y, chain.out, chain)
            p_e = parity(y, eager, chain, extra, sides=2, gate_differ=not extra)
            name = str(dtype).replace("torch.", "")
            gate = "group_norm_silu" if s.op == "gn" else "rms_norm_silu_channels"
            shp = "x".join(map(str, s.shape))
            forced = f" ({path} forced)" if launch else ""
            gates.add(
                gate,
                f"{s.name}{forced} {name}",
                p.ok and p_e.ok,
                f"{shp} {path}; vs fp64 ref: {p.describe()}; vs eager{note}: {p_e.describe()}",
            )
            del x, y, chain, eager, extra
