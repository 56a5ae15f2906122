"""The input families 8-bit attention is judged on, deterministic by seed.

Each family is q, k, v of shape (B, S, H, D), drawn in float32 and rounded once to the
requested dtype (bf16 in the bench). They stress one thing a per-token / per-tensor 8-bit
scheme can get wrong:

``randn``         every element N(0, 1): the easy case.
``rmsnorm_rope``  q and k after a per-head RMSNorm (over D, eps 1e-6) with log-normal
                  per-channel weights ``exp(0.5 N(0, 1))`` of their own (shape (D,), shared by
                  the heads, as FLUX's / Wan's norm_q / norm_k), then interleaved RoPE
                  (base 10000, positions 0..S-1): channels of unequal size, rotating.
``k_offset``      k plus a per-(head, channel) offset ``N(0, 5^2)`` shared by every token:
                  the scores' large common part that softmax ignores but a per-token int8 K
                  scale must carry.
``sharp``         q scaled so that ``q . k * D^-0.5`` has std 6: peaked softmax rows, where
                  P's rounding and the few large scores decide the output.
``v_outlier``     v with 4 channels (the same in every head) times 20: V's scale is set by
                  a few channels.
``local``         neighbouring tokens alike: each of q, k, v is white noise box-smoothed
                  over 32 tokens (unit variance) plus a random walk along the sequence
                  scaled to reach std 1 at the last token.

v is N(0, 1) where the family says nothing else. ``attention_inputs(family, B, S, H, D)``
draws one family; the bench's accuracy columns run all of them (``FAMILIES``)."""

from __future__ import annotations

import torch

#: the families, in the order of the bench's accuracy columns
FAMILIES = ("randn", "rmsnorm_rope", "k_offset", "sharp", "v_outlier", "local")

K_OFFSET_STD = 5.0
SHARP_LOGIT_STD = 6.0
V_OUTLIER_CHANNELS, V_OUTLIER_GAIN = 4, 20.0
LOCAL_WINDOW = 32


def _rope_interleaved(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Interleaved-pair RoPE of a (B, S, H, D) fp32 tensor at positions 0..S-1."""
    S, D = x.shape[1], x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, D, 2, device=x.device, dtype=torch.float64) / D)
    ang = torch.arange(S, device=x.device, dtype=torch.float64)[:, None] * inv[None]
    c, s = ang.cos().float()[None, :, None], ang.sin().float()[None, :, None]  # (1, S, 1, D/2)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2)


def _local(B, S, H, D, g, device) -> torch.Tensor:
    """Box-smoothed white noise (unit variance) plus a random walk along the sequence."""
    W = LOCAL_WINDOW
    e = torch.randn(B, S + W, H, D, generator=g, device=device)
    c = torch.cat((torch.zeros_like(e[:, :1]), e.cumsum(1)), 1)
    smooth = (c[:, W : W + S] - c[:, :S]) / W**0.5
    del e, c
    walk = torch.randn(B, S, H, D, generator=g, device=device).cumsum(1) / S**0.5
    return smooth + walk


def attention_inputs(
    family: str, B: int, S: int, H: int, D: int, device="cpu", dtype=torch.bfloat16, seed: int = 0
):
    """q, k, v (B, S, H, D) in ``dtype`` of one family (module docstring), deterministic by
    ``seed`` on a given device."""
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    g = torch.Generator(device=device).manual_seed(seed)
    sz = (B, S, H, D)

    def randn(*shape):
        return torch.randn(shape or sz, generator=g, device=device, dtype=torch.float32)

    if family == "local":
        q, k, v = (_local(B, S, H, D, g, device) for _ in range(3))
        return q.to(dtype), k.to(dtype), v.to(dtype)
    q, k, v = randn(), randn(), randn()
    if family == "rmsnorm_rope":

        def norm(x):
            w = torch.exp(0.5 * randn(D))
            return _rope_interleaved(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w)

        q, k = norm(q), norm(k)
    elif family == "k_offset":
        k = k + K_OFFSET_STD * randn(H, D)
    elif family == "sharp":  # q . k ~ N(0, D) for N(0, 1) q and k: q . k * D^-0.5 has std 1
        q = q * SHARP_LOGIT_STD
    elif family == "v_outlier":
        ch = torch.randperm(D, generator=g, device=device)[:V_OUTLIER_CHANNELS]
        v[..., ch] *= V_OUTLIER_GAIN
    return q.to(dtype), k.to(dtype), v.to(dtype)
