"""Inputs for a registry shape, and the eager code the models run today (as diffusers writes
it), shared by ``ditfuse check`` and ``ditfuse bench``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ditfuse.norms import NormSpec
from ditfuse.tolerances import cos_rel
from ditfuse.tools.attention_inputs import FAMILIES, attention_inputs
from ditfuse.tools.shapes import QKShape


def rope_table(S: int, D: int, style: str, device, dtype=torch.float32, base: float = 10000.0):
    """(S, D) cos/sin as diffusers builds them: repeat-interleaved for interleaved pairs,
    cat-duplicated for rotate-half."""
    inv = 1.0 / base ** (torch.arange(0, D, 2, device=device, dtype=torch.float64) / D)
    ang = torch.arange(S, device=device, dtype=torch.float64)[:, None] * inv[None]
    c, s = ang.cos(), ang.sin()
    if style == "interleaved":
        c, s = c.repeat_interleave(2, -1), s.repeat_interleave(2, -1)
    else:
        c, s = torch.cat((c, c), -1), torch.cat((s, s), -1)
    return c.to(dtype), s.to(dtype)


def model_tables(shape: QKShape, cos: torch.Tensor, sin: torch.Tensor):
    """The full cos/sin tables as the patched model's processor hands them to
    ``qk_norm_rope`` (``shape.table``): as they are; Wan's ``cos[..., 0::2]`` /
    ``sin[..., 1::2]`` columns packed, one value a pair (``patching/wan.py``);
    or the real / imaginary parts of the complex frequencies Qwen-Image builds, packed
    (``patching/qwen.py``). The processors make these once per step's table
    (``patching.common.table_once``)."""
    if shape.table == "wan":
        from ditfuse.patching.wan import _wan_cos, _wan_sin

        return _wan_cos(cos), _wan_sin(sin)
    if shape.table == "complex":
        from ditfuse.patching.qwen import _imag, _real

        freqs = torch.complex(cos[..., 0::2], sin[..., 0::2])  # Qwen's (S, D/2) freqs
        return _real(freqs), _imag(freqs)
    return cos, sin


def qk_inputs(shape: QKShape, device, dtype=torch.bfloat16, seed: int = 0):
    """Random inputs (never zeros) for one registry shape.

    Returns a dict: ``buf`` (the packed projection, ``shape.packed``), ``q``, ``k``,
    ``cos``, ``sin`` (full width, for the references), ``call_cos``, ``call_sin`` (the
    same tables as the patched model passes them: ``model_tables``), ``q_norm``,
    ``k_norm`` (NormSpecs) and ``kwargs`` for ``qk_norm_rope``.
    """
    g = torch.Generator(device=device).manual_seed(seed)
    B, S, H, D = shape.B, shape.S, shape.H, shape.D

    def randn(*sz, scale=1.0, shift=0.0):
        return (
            torch.randn(*sz, generator=g, device=device, dtype=torch.float32) * scale + shift
        ).to(dtype)

    out = {"buf": None}
    if shape.form == "bhsd":
        out.update(q=randn(B, H, S, D), k=randn(B, H, S, D))
        kwargs = {"layout": "bhsd"}
    else:  # (B, S, H*D) rows: chunks of one fused projection (packed) or tensors of their own
        HD, kc = H * D, shape.k_chunk
        if shape.packed:
            buf = randn(B, S, shape.packed * HD)
            q, k = buf[..., :HD], buf[..., kc * HD : (kc + 1) * HD]
            out["buf"] = buf
        else:
            q, k = randn(B, S, HD), randn(B, S, HD)
        if shape.form == "flat":
            kwargs = {"num_heads": H}
        else:
            q, k = q.unflatten(-1, (H, D)), k.unflatten(-1, (H, D))
            kwargs = {}
        out.update(q=q, k=k)
    n = H * D if shape.span == "all" else D
    norms = []
    for _ in range(2):
        if shape.norm == "dyt":
            norms.append(
                NormSpec(
                    "dyt",
                    weight=randn(n, scale=0.5, shift=1.0),
                    bias=randn(n, scale=0.1),
                    alpha=torch.full((1,), 0.8, device=device, dtype=dtype),
                    eps=None,
                )
            )
        else:
            norms.append(NormSpec("rms", weight=randn(n, scale=0.5, shift=1.0), eps=1e-6))
    out["q_norm"], out["k_norm"] = norms
    R = shape.rotary_dim or D
    c, s = rope_table(S, R, shape.style, device)
    if shape.name.startswith("wan"):  # Wan passes (1, S, 1, D) tables
        c, s = c[None, :, None], s[None, :, None]
    out["cos"], out["sin"] = c, s
    out["call_cos"], out["call_sin"] = model_tables(shape, c, s)
    kwargs.update(rope_style=shape.style, rotary_dim=R)
    out["kwargs"] = kwargs
    return out


# --------------------------------------------------------------------------------------
# eager code as the models write it (diffusers 0.42), the baseline users run today


def _rms_eager(x, w, eps):  # diffusers RMSNorm / torch.nn.RMSNorm arithmetic, fp32 math
    dt = x.dtype
    v = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(v + eps) * w.float()).to(dt)


def _dyt_eager(x, norm):  # SAME DynamicTanh: gamma * tanh(alpha * x) + beta
    return norm.weight * torch.tanh(norm.alpha * x) + norm.bias


def _rope_interleaved(x, cos, sin):  # diffusers apply_rotary_emb(use_real_unbind_dim=-1)
    xr, xi = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    xrot = torch.stack([-xi, xr], dim=-1).flatten(-2)
    return (x.float() * cos + xrot.float() * sin).to(x.dtype)


def _rope_half_partial(x, cos, sin, R):  # Stable Audio 3 / SAME _apply_rotary_partial
    xr, xp = x[..., :R].float(), x[..., R:]
    x1, x2 = xr.unflatten(-1, (2, -1)).unbind(-2)
    rot = torch.cat((-x2, x1), dim=-1)
    return torch.cat(((xr * cos + rot * sin).to(x.dtype), xp), dim=-1)


def eager_fn(shape: QKShape):
    """``f(inputs) -> (q, k)``: the model's own eager chain for this shape."""
    H, D = shape.H, shape.D
    R = shape.rotary_dim or D

    def f(inp):
        q, k, cos, sin = inp["q"], inp["k"], inp["cos"], inp["sin"]
        qn, kn = inp["q_norm"], inp["k_norm"]
        if shape.form == "flat":  # Wan: RMSNorm over all heads, unflatten, inline RoPE
            q = F.rms_norm(q, (H * D,), qn.weight, qn.eps).unflatten(2, (H, -1))
            k = F.rms_norm(k, (H * D,), kn.weight, kn.eps).unflatten(2, (H, -1))
            c, s = cos[..., 0::2], sin[..., 1::2]
            outs = []
            for x in (q, k):
                x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
                o = torch.empty_like(x)
                o[..., 0::2] = x1 * c - x2 * s
                o[..., 1::2] = x1 * s + x2 * c
                outs.append(o)
            return outs[0], outs[1]
        if shape.norm == "dyt":
            q, k = _dyt_eager(q, qn), _dyt_eager(k, kn)
        else:
            q, k = _rms_eager(q, qn.weight, qn.eps), _rms_eager(k, kn.weight, kn.eps)
        if shape.style == "half":
            c, s = cos[:, None], sin[:, None]
            return _rope_half_partial(q, c, s, R), _rope_half_partial(k, c, s, R)
        if shape.form == "bhsd":
            c, s = cos[None, None], sin[None, None]
        else:
            c, s = cos[None, :, None], sin[None, :, None]
        return _rope_interleaved(q, c, s), _rope_interleaved(k, c, s)

    return f


def qk_bytes(shape: QKShape, dtype=torch.bfloat16, table_dtype=torch.float32) -> int:
    """Fewest bytes the op must move: Q and K read and written once, the table row once per
    token (as the model passes it, ``shape.table``)."""
    el = torch.empty((), dtype=dtype).element_size()
    tel = torch.empty((), dtype=table_dtype).element_size()
    R = shape.rotary_dim or shape.D
    # cos and sin, R values each a token; the patched Qwen-Image and Wan pass R/2 (one a pair)
    table = shape.S * R * tel * (1 if shape.table in ("complex", "wan") else 2)
    return 4 * shape.B * shape.S * shape.H * shape.D * el + table


# --------------------------------------------------------------------------------------
# AdaLN: inputs and the blocks' eager chains


def adaln_inputs(shape, device, dtype=torch.bfloat16, seed: int = 0):
    """x, y (branch output) and shift/scale/gate views of a temb, as the model builds them."""
    g = torch.Generator(device=device).manual_seed(seed)
    B, S, D = shape.B, shape.S, shape.D
    x = torch.randn(B, S, D, generator=g, device=device).to(dtype)
    y = torch.randn(B, S, D, generator=g, device=device).to(dtype)
    if shape.model == "flux":  # emb.chunk(6, dim=1) in the activation dtype
        temb = (torch.randn(B, 6 * D, generator=g, device=device) * 0.3).to(dtype)
        shift, scale, gate = temb.chunk(6, 1)[:3]
    elif shape.per_token:  # Wan 2.2 TI2V: (B, S, 6, D) fp32
        temb = torch.randn(B, S, 6, D, generator=g, device=device) * 0.3
        shift, scale, gate = [t.squeeze(2) for t in temb.chunk(6, 2)[:3]]
    else:  # Wan: (table + temb.float()).chunk(6, dim=1)
        temb = torch.randn(B, 6, D, generator=g, device=device) * 0.3
        shift, scale, gate = temb.chunk(6, 1)[:3]
    return dict(x=x, y=y, shift=shift, scale=scale, gate=gate)


def adaln_eager(shape):
    """(modulate, gated residual + modulate, gated residual alone) as the blocks write them."""
    D = shape.D
    if shape.model == "flux":  # AdaLayerNormZero / the FLUX block, in the activation dtype

        def mod(s):
            return (
                F.layer_norm(s["x"], (D,), eps=1e-6) * (1 + s["scale"][:, None])
                + s["shift"][:, None]
            )

        def res(s):
            x = s["x"] + s["gate"][:, None] * s["y"]
            return x, F.layer_norm(x, (D,), eps=1e-6) * (1 + s["scale"][:, None]) + s["shift"][
                :, None
            ]

        def residual(s):  # the FF residual: hidden_states + gate_mlp.unsqueeze(1) * ff_output
            return s["x"] + s["gate"][:, None] * s["y"]
    else:  # WanTransformerBlock: fp32 chain, one cast

        def mod(s):
            x = s["x"]
            return (
                F.layer_norm(x.float(), (D,), eps=1e-6) * (1 + s["scale"]) + s["shift"]
            ).type_as(x)

        def res(s):
            x = (s["x"].float() + s["y"] * s["gate"]).type_as(s["x"])
            return x, (
                F.layer_norm(x.float(), (D,), eps=1e-6) * (1 + s["scale"]) + s["shift"]
            ).type_as(x)

        def residual(s):  # the FFN residual: (x.float() + ff.float() * c_gate).type_as(x)
            return (s["x"].float() + s["y"].float() * s["gate"]).type_as(s["x"])

    return mod, res, residual


# --------------------------------------------------------------------------------------
# Full attention (the 8-bit attention rows): inputs, the fp64 reference on a subset

#: the input families the accuracy columns are measured on (``tools.attention_inputs``)
ATTN_INPUT_KINDS = FAMILIES


def full_attention_inputs(shape, device, dtype=torch.bfloat16, kind: str = "randn", seed: int = 0):
    """q, k, v (B, S, H, D) in ``dtype`` at a ``FullAttnShape``: one input family of
    :func:`ditfuse.tools.attention_inputs.attention_inputs` (``kind``: random normal,
    RMSNorm'd + RoPE'd q / k, a key offset shared by the tokens, sharp softmax, outlier V
    channels, neighbouring tokens alike)."""
    return attention_inputs(kind, shape.B, shape.S, shape.H, shape.D, device, dtype, seed)


def attention_subset(S: int, H: int, rows: int = 2048, heads: int = 2, device="cpu"):
    """(query rows, heads) of the accuracy subset: ``rows`` query positions evenly spread
    over the sequence (all of them when S <= rows) and ``heads`` heads evenly spread (the
    first and the last of two)."""
    r = torch.linspace(0, S - 1, min(rows, S), device=device).round().long().unique()
    h = torch.linspace(0, H - 1, min(heads, H), device=device).round().long().unique()
    return r, h


def attention_reference_subset(q, k, v, rows, heads, scale=None, chunk: int = 256):
    """fp64 softmax attention of the chosen query rows and heads over every key: (B, R, h, D)
    float64, the same positions as ``out[:, rows][:, :, heads]`` of a (B, S, H, D) output."""
    D = q.shape[-1]
    scale = 1.0 / D**0.5 if scale is None else scale
    kh = k[:, :, heads].double().transpose(1, 2)  # (B, h, S, D)
    vh = v[:, :, heads].double().transpose(1, 2)
    outs = []
    for i in range(0, rows.numel(), chunk):
        qh = q[:, rows[i : i + chunk]][:, :, heads].double().transpose(1, 2)  # (B, h, r, D)
        p = torch.softmax(qh @ kh.transpose(-1, -2) * scale, dim=-1)
        outs.append((p @ vh).transpose(1, 2))
        del p
    return torch.cat(outs, 1)


def subset_errors(out, ref, rows, heads) -> tuple:
    """(cosine similarity, relative L2 error) of ``out[:, rows][:, :, heads]`` (a (B, S, H, D)
    output) flattened against ``ref`` (:func:`attention_reference_subset`)."""
    return cos_rel(out[:, rows][:, :, heads], ref)
