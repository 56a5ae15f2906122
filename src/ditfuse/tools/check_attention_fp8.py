"""``ditfuse check`` gates of 8-bit attention and its quantizing prologue."""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F

import ditfuse
from ditfuse import tolerances
from ditfuse.ops import attention_api as API
from ditfuse.ops import attention_fp8 as A
from ditfuse.ops import attention_fp8_ws as WS
from ditfuse.reference import attention_8bit_core, quantize_per_token

#: the accuracy 8-bit attention promises against float64 (docs/attention_fp8.md)
COS_MIN = tolerances.ATTENTION_8BIT_COS_MIN
REL_L2_MAX = tolerances.ATTENTION_8BIT_REL_L2_MAX
#: the kernel against its PyTorch emulation (same operands; P rounded against the running max)
KERNEL_VS_EMULATION = tolerances.ATTENTION_8BIT_VS_EMULATION

#: (name, H, S, D) at production size; the interpreter runs S_SMALL tokens of 2 heads
SHAPES = [("wan14b-480p", 40, 32760, 128), ("flux2-1024", 48, 4608, 128), ("d64", 16, 4096, 64)]
KINDS = ("randn", "rmsnorm")
S_SMALL = 160
#: heads and query rows the float64 reference evaluates (all keys)
REF_HEADS = 2
REF_ROWS = 1024


def _shapes(small: bool):
    """The production shapes; through the interpreter each head_dim once (at a few tokens of
    two heads, Wan's and FLUX.2's shapes are the same case)."""
    if not small:
        return SHAPES
    seen, out = set(), []
    for name, H, S, D in SHAPES:
        if D not in seen:
            seen.add(D)
            out.append((name, 2, S_SMALL, D))
    return out


#: the 8-bit-input gates: q / k format, key mask
QK_8BIT = [("int8", False), ("int8", True), ("fp8", True)]


#: the e4m3-output gates: key mask or not
OUT_ROWS8 = (False, True)


def planned(small: bool = False) -> int:
    return len(_shapes(small)) * len(KINDS) + 2 + len(QK_8BIT) + len(OUT_ROWS8)


def _operands(q, k):
    """The 8-bit q / k and their (B, H, S) scales that ``attention(q, k, v, precision="fp8")``
    computes with on this device: the warp-specialized kernel's (K less its (batch, head)'s
    mean key, one scale a tile of keys, expanded to its tokens; the mean shifts every score
    of a query by one value, which softmax ignores) where the call routes there, else the
    per-token quantization the Triton kernel gets."""
    if API._ws_ok(q, k, None):
        B, S, H, _ = k.shape
        k8, tiles = WS.quantize_k_blocks(k)
        k_scale = tiles.view(B, H, -1).repeat_interleave(WS.BLOCK_N, dim=-1)[..., :S]
        q8, q_scale = A.quantize_per_token(q)
        return q8, k8, q_scale, k_scale
    return API._quantize_qk(q, k, "bshd")


def _subset(H: int, S: int, device):
    """The heads and query rows the float64 reference evaluates (all keys)."""
    heads = torch.linspace(0, H - 1, min(REF_HEADS, H), device=device).long()
    rows = torch.linspace(0, S - 1, min(REF_ROWS, S), device=device).long()
    return heads, rows


def _reference64(q, k, v, heads, rows, key_mask=None):
    """Softmax attention in float64 of ``rows`` of ``heads`` over every key (``key_mask``:
    bool (B, S_kv), the keys kept), (B, rows, heads, D)."""
    qd = q[:, rows][:, :, heads].double().transpose(1, 2)
    kd, vd = (x[:, :, heads].double().transpose(1, 2) for x in (k, v))
    sc = qd @ kd.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if key_mask is not None:
        sc = sc.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    return (sc.softmax(-1) @ vd).transpose(1, 2)


@torch.no_grad()
def check_gates(g, device, small: bool):
    """Accuracy of ``attention(precision="fp8")`` (16-bit q / k / v in, the op quantizing
    them) against float64 on a subset of heads and rows, and against its emulation; the
    prologue's 8-bit output bitwise equal to the quantization of its 16-bit output."""
    for name, H, S, D in _shapes(small):
        for kind in KINDS:
            gen = torch.Generator(device=device).manual_seed(zlib.crc32(f"{name} {kind}".encode()))
            q, k, v = (
                torch.randn(1, S, H, D, generator=gen, device=device).bfloat16() for _ in range(3)
            )
            if kind == "rmsnorm":
                w = (1 + 0.5 * torch.randn(D, generator=gen, device=device)).abs() + 0.1
                q = (F.rms_norm(q.float(), (D,)) * w).bfloat16()
                k = (F.rms_norm(k.float(), (D,)) * w).bfloat16()
            out = ditfuse.attention(q, k, v, precision="fp8")
            heads, rows = _subset(H, S, device)
            ref = _reference64(q, k, v, heads, rows)
            sub = out[:, rows][:, :, heads]
            cos, rel = tolerances.cos_rel(sub, ref)
            q8, k8, q_scale, k_scale = _operands(q, k)
            emu = attention_8bit_core(
                q8[:, rows][:, :, heads],
                k8[:, :, heads],
                v[:, :, heads],
                q_scale[:, heads][:, :, rows],
                k_scale[:, heads],
                scale=1.0 / math.sqrt(D),
            )
            dev = tolerances.cos_rel(sub, emu)[1]
            finite = bool(torch.isfinite(out).all())
            ok = finite and cos >= COS_MIN and rel <= REL_L2_MAX and dev <= KERNEL_VS_EMULATION
            g.add(
                "attention fp8",
                f"{name} {kind}",
                ok,
                f"H={H} S={S} D={D} vs fp64 ({len(heads)} heads x {len(rows)} rows): cos "
                f"{cos:.5f} (>= {COS_MIN}), rel L2 {rel:.4f} (<= {REL_L2_MAX}); vs emulation "
                f"{dev:.4f} (<= {KERNEL_VS_EMULATION}){'' if finite else '; NON-FINITE'}",
            )
            del q, k, v, out, q8, k8
    # the prologue: Wan's norm across heads with interleaved RoPE, FLUX's per-head RMSNorm
    H, D, S = (2, 128, 24) if small else (40, 128, 4096)
    gen = torch.Generator(device=device).manual_seed(7)
    angle = torch.rand(S, D // 2, generator=gen, device=device) * 6.28
    cos_t, sin_t = (f(angle).repeat_interleave(2, -1) for f in (torch.cos, torch.sin))
    for name, across in (
        ("wan across-heads rms + rope", True),
        ("flux per-head rms + rope", False),
    ):
        q, k = (torch.randn(1, S, H * D, generator=gen, device=device).bfloat16() for _ in range(2))
        n = H * D if across else D
        norm = torch.nn.RMSNorm(n, eps=1e-6, device=device, dtype=torch.bfloat16)
        norm.weight.copy_(1 + 0.3 * torch.randn(n, generator=gen, device=device))
        kw = dict(q_norm=norm, k_norm=norm, num_heads=H)
        y_q, y_k = ditfuse.qk_norm_rope(q, k, cos_t, sin_t, **kw)
        qq = ditfuse.qk_norm_rope(q, k, cos_t, sin_t, quantize="int8", **kw)
        rq, rqs = quantize_per_token(y_q, "int8", num_heads=H)
        rk, rks = quantize_per_token(y_k, "int8", num_heads=H)
        same = (
            torch.equal(qq.q, rq)
            and torch.equal(qq.k, rk)
            and torch.equal(qq.q_scale, rqs)
            and torch.equal(qq.k_scale, rks)
        )
        g.add(
            "qk quantize bitwise",
            name,
            same,
            f"H={H} D={D} S={S} bf16: int8 Q/K and scales "
            f"{'equal' if same else 'DIFFER from'} quantize_per_token(16-bit output)",
        )


@torch.no_grad()
def check_8bit_qk_gates(g, device, small: bool):
    """``attention(q8, k8, v, precision="fp8", q_scale=, k_scale=)`` -- what the prologue's
    8-bit Q / K take, with and without a key mask -- against float64 softmax attention of the
    16-bit inputs on a subset of heads and rows; the row names the path that ran (the Triton
    kernel, or its emulation where the kernel is off)."""
    H, S, D = (2, S_SMALL, 128) if small else (8, 4096, 128)
    for fmt, masked in QK_8BIT:
        gen = torch.Generator(device=device).manual_seed(zlib.crc32(f"{fmt} {masked}".encode()))
        q, k, v = (
            torch.randn(1, S, H, D, generator=gen, device=device).bfloat16() for _ in range(3)
        )
        km = torch.rand(1, S, generator=gen, device=device) > 0.3 if masked else None
        q8, qs = quantize_per_token(q, fmt)
        k8, ks = quantize_per_token(k, fmt)
        out = ditfuse.attention(q8, k8, v, precision="fp8", q_scale=qs, k_scale=ks, key_mask=km)
        kernel = A._kernel_ok(A.plan(q8, k8, v, q_scale=qs, k_scale=ks, key_mask=km))
        heads, rows = _subset(H, S, device)
        ref = _reference64(q, k, v, heads, rows, km)
        cos, rel = tolerances.cos_rel(out[:, rows][:, :, heads], ref)
        finite = bool(torch.isfinite(out).all())
        cmin, rmax = (
            (COS_MIN, REL_L2_MAX)
            if fmt == "int8"
            else (
                tolerances.ATTENTION_8BIT_E4M3_QK_COS_MIN,
                tolerances.ATTENTION_8BIT_E4M3_QK_REL_L2_MAX,
            )
        )
        g.add(
            "attention fp8 (8-bit q / k)",
            f"{fmt}{' key mask' if masked else ''}",
            finite and cos >= cmin and rel <= rmax,
            f"H={H} S={S} D={D}, {'the Triton kernel' if kernel else 'the emulation'}: vs "
            f"fp64 cos {cos:.5f} (>= {cmin}), rel L2 {rel:.4f} (<= {rmax})"
            f"{'' if finite else '; NON-FINITE'}",
        )


@torch.no_grad()
def check_out_rows8_gates(g, device, small: bool):
    """``attention(..., precision="fp8", quantize_out="fp8")`` at Wan-14B's self-attention
    (a few tokens of two heads through the interpreter), with and without a key mask: the
    e4m3 rows and scales bitwise :func:`ditfuse.reference.attention_out_rows8` of the same
    call's 16-bit output, every element (on an sm_90 GPU the warp-specialized kernel's
    epilogue)."""
    from ditfuse.reference import attention_out_rows8

    H, S, D = (2, S_SMALL, 128) if small else (40, 32760, 128)
    for masked in OUT_ROWS8:
        gen = torch.Generator(device=device).manual_seed(zlib.crc32(f"rows8 {masked}".encode()))
        q, k, v = (
            torch.randn(1, S, H, D, generator=gen, device=device).bfloat16() for _ in range(3)
        )
        km = torch.rand(1, S, generator=gen, device=device) > 0.3 if masked else None
        o16 = ditfuse.attention(q, k, v, precision="fp8", key_mask=km)
        r = ditfuse.attention(q, k, v, precision="fp8", key_mask=km, quantize_out="fp8")
        want_q, want_s = attention_out_rows8(o16, v, km)
        same = torch.equal(r.q.view(torch.uint8), want_q.flatten(2).view(torch.uint8))
        same = same and torch.equal(r.scale, want_s)
        deq = r.q.float() * r.scale[..., None]
        rel = ((deq - o16.flatten(2).float()).norm() / o16.float().norm()).item()
        route = "the warp-specialized kernel's epilogue" if API._ws_ok(q, k, None) else "a pass"
        g.add(
            "attention fp8 e4m3 out",
            "key mask" if masked else "all keys",
            same,
            f"H={H} S={S} D={D} bf16, {route}: e4m3 rows and scales "
            f"{'equal' if same else 'DIFFER from'} attention_out_rows8(16-bit output); "
            f"dequantized vs the 16-bit output rel L2 {rel:.4f}",
        )
