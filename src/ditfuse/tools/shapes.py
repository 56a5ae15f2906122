"""The one registry of production shapes (the models' own code and configs:
``docs/patching.md``), used by ``ditfuse check`` and ``ditfuse bench``."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Tuple


def by_name(*shapes) -> dict:
    """A registry: ``shapes`` keyed by their ``name``, in order; a name given twice raises."""
    reg = {s.name: s for s in shapes}
    if len(reg) != len(shapes):
        raise ValueError(f"shape names given twice: {[s.name for s in shapes]}")
    return reg


@dataclass(frozen=True)
class QKShape:
    """One model's QK-norm + RoPE call.

    ``form``: how Q/K reach the op: "flat" (B, S, H*D) rows with ``num_heads`` (Wan);
    "bshd" / "bhsd" (B, S, H, D) / (B, H, S, D) tensors. ``packed``: Q and K are chunks of
    one fused projection (Wan's QKV, Stable Audio's differential to_qkv) rather than
    tensors of their own.
    ``table``: how the patched model passes its RoPE table to the op: "full" (S, D) cos/sin
    (repeat-interleaved or cat-duplicated, FLUX / HunyuanVideo / Stable Audio); "wan" the
    ``cos[..., 0::2]`` / ``sin[..., 1::2]`` columns of Wan's (1, S, 1, D) tables, packed
    (S, D/2: one value a pair); "complex" the real / imaginary parts of Qwen-Image's
    complex (S, D/2) frequencies, packed (as the patched processors pass them).
    """

    name: str
    model: str
    S: int
    H: int
    D: int
    norm: str = "rms"  # "rms" or "dyt"
    span: str = "head"  # "head" (weight D) or "all" (weight H*D)
    style: str = "interleaved"
    rotary_dim: int | None = None
    form: str = "bshd"
    B: int = 1
    table: str = "full"
    inplace: bool = False  # the patched processor normalises Q / K in place
    packed: int = 0  # Q and K are chunks of one projection of this many chunks
    k_chunk: int = 1  # (Q chunk 0, K chunk k_chunk), as the model splits to_qkv

    def small(self, S: int = 6) -> "QKShape":
        """The same call with few tokens, for the interpreter."""
        return replace(self, S=min(S, self.S))


#: Wan's call: (B, S, H*D) rows, one RMSNorm across the heads, the packed half-width tables
_WAN_QK = dict(span="all", form="flat", table="wan")

QK_SHAPES = by_name(
    # diffusers' Wan projects Q, K and V with to_q / to_k / to_v (tensors of their own)
    # unless ``fuse_projections()`` was called: then Q and K are chunks of to_qkv's rows
    # (the "-fused" rows); the patched processor writes fresh Q / K in either case (out of
    # place: faster than in place, docs/design/qk_norm_rope.md)
    QKShape("wan14b-480p", "Wan2.x 14B T2V 480p 81f", 21 * 30 * 52, 40, 128, **_WAN_QK),
    QKShape("wan14b-720p", "Wan2.x 14B T2V 720p 81f", 21 * 45 * 80, 40, 128, **_WAN_QK),
    QKShape("wan1.3b-480p", "Wan2.1 1.3B 480p 81f", 21 * 30 * 52, 12, 128, **_WAN_QK),
    QKShape("wan5b-ti2v-704p", "Wan2.2 TI2V 5B 704p 121f", 31 * 44 * 78 // 4, 24, 128, **_WAN_QK),
    QKShape(
        "wan14b-480p-fused",
        "Wan2.x 14B 480p, fused QKV projection",
        21 * 30 * 52,
        40,
        128,
        **_WAN_QK,
        packed=3,
    ),
    QKShape(
        "wan14b-720p-fused",
        "Wan2.x 14B 720p, fused QKV projection",
        21 * 45 * 80,
        40,
        128,
        **_WAN_QK,
        packed=3,
    ),
    QKShape("flux1-1024", "FLUX.1-dev 1024^2", 4096 + 512, 24, 128),
    QKShape("flux2-1024", "FLUX.2-dev 1024^2", 4096 + 512, 48, 128),
    QKShape("qwen-image-1328", "Qwen-Image 1328^2", 83 * 83 + 512, 24, 128, table="complex"),
    # diffusers 0.42's HunyuanVideo processor keeps (B, S, H, D) (apply_rotary_emb with
    # sequence_dim=1); the patched one normalises those projections into fresh Q / K in the
    # single-stream blocks (40 of 60; this row), into the joint Q / K in the dual-stream ones
    QKShape("hunyuan-video-544p", "HunyuanVideo 544x960 61f", 16 * 34 * 60, 24, 128),
    # Stable Audio 3 / SAME: q1, k1 are chunks 0 and 2 of the differential [q1|q2|k1|k2|v]
    # to_qkv output; SA3's patched processor normalises them in place, SAME's attention call
    # into scratch (its prologue run apart)
    QKShape(
        "sa3-dit",
        "Stable Audio 3 DiT",
        4096,
        24,
        64,
        style="half",
        rotary_dim=32,
        inplace=True,
        packed=5,
        k_chunk=2,
    ),
    QKShape(
        "same-l-decoder",
        "SAME-L decoder (3 min)",
        17 * 1938,
        24,
        64,
        norm="dyt",
        style="half",
        rotary_dim=32,
        packed=5,
        k_chunk=2,
    ),
)


@dataclass(frozen=True)
class AdaLNShape:
    """One AdaLN call: x (B, S, D). ``model`` "wan": fp32 temb chunks, rounding once;
    "flux": temb in the activation dtype, rounding per op (AdaLayerNormZero)."""

    name: str
    model: str
    S: int
    D: int
    B: int = 1
    per_token: bool = False  # Wan 2.2 TI2V: shift/scale per token

    def small(self, S: int = 4) -> "AdaLNShape":
        return replace(self, S=min(S, self.S))


ADALN_SHAPES = by_name(
    AdaLNShape("wan14b-480p", "wan", 21 * 30 * 52, 5120),
    AdaLNShape("wan14b-720p", "wan", 21 * 45 * 80, 5120),
    AdaLNShape("wan5b-ti2v-704p", "wan", 31 * 44 * 78 // 4, 3072, per_token=True),
    AdaLNShape("flux1-1024", "flux", 4096 + 512, 3072),
    AdaLNShape("flux2-1024", "flux", 4096 + 512, 6144),
)


@dataclass(frozen=True)
class ActShape:
    """One MLP activation call: x (B, S, W) -> y (B, S, N). ``op`` "swiglu" (W = 2N:
    FLUX.2's ``Flux2SwiGLU``) or "gelu_tanh" (W = N: FLUX.1's single-stream ``act_mlp``).
    ``offset`` > 0: x is the column slice ``proj[..., offset:]`` of a wider projection (the
    MLP columns of FLUX.2's fused ``to_qkv_mlp_proj``, after Q, K and V)."""

    name: str
    model: str
    op: str
    S: int
    N: int
    offset: int = 0
    B: int = 1

    @property
    def W(self) -> int:
        return 2 * self.N if self.op == "swiglu" else self.N

    def small(self, S: int = 3) -> "ActShape":
        return replace(self, S=min(S, self.S))


ACT_SHAPES = by_name(
    ActShape(
        "flux2-1024",
        "FLUX.2-dev 1024^2, single-stream block (MLP columns of the fused projection)",
        "swiglu",
        4096 + 512,
        18432,
        offset=3 * 6144,
    ),
    ActShape(
        "flux2-1024-ff",
        "FLUX.2-dev 1024^2, double-stream block FF (image stream)",
        "swiglu",
        4096,
        18432,
    ),
    ActShape(
        "flux1-1024",
        "FLUX.1-dev 1024^2, single-stream block act_mlp",
        "gelu_tanh",
        4096 + 512,
        12288,
    ),
)


@dataclass(frozen=True)
class AttnShape:
    """One band attention call: q/k/v (B, N, H, D), |i - j| <= window; ``differential``:
    out = Attn(q1, k1, v) - Attn(q2, k2, v) (SAME / SA3: q/k as [q1 | q2] heads)."""

    name: str
    model: str
    N: int
    H: int = 24
    D: int = 64
    window: int = 17
    differential: bool = True
    B: int = 1

    def small(self, N: int = 40) -> "AttnShape":
        return replace(self, N=min(N, self.N), H=min(self.H, 2))


ATTN_SHAPES = by_name(
    AttnShape("same-l-8704", "SAME-L decoder, 512 latents (48 s)", 17 * 512),
    AttnShape("same-l-32946", "SAME-L decoder, 3 min of audio", 17 * 1938),
    AttnShape(
        "same-l-8704-plain", "SAME-L decoder, non-differential", 17 * 512, differential=False
    ),
    AttnShape(
        "same-l-32946-plain",
        "SAME-L decoder, 3 min of audio, non-differential",
        17 * 1938,
        differential=False,
    ),
    AttnShape("same-l-trt", "the seed's TensorRT contract (1, 4352, 48, 64) fp32", 4352),
)


@dataclass(frozen=True)
class GNShape:
    """One norm + SiLU call of a VAE decoder: x of ``shape`` = (N, C, *spatial).

    ``op``: "gn" (GroupNorm(groups, C, eps=1e-6, affine) then SiLU: AutoencoderKL of
    FLUX.1 / FLUX.2, HunyuanVideo's 3-D VAE) or "rms" (Wan's ``WanRMS_norm`` then SiLU).
    ``channels_last``: x in channels-last(-3d) memory, as inductor lays out the FLUX VAE's
    convolutions under torch.compile.
    """

    name: str
    model: str
    shape: Tuple[int, ...]
    op: str = "gn"
    groups: int = 32
    channels_last: bool = False

    def layout(self, x):
        """``x`` (of this shape) in the memory layout this case runs."""
        if not self.channels_last:
            return x
        import torch

        return x.contiguous(
            memory_format=torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        )

    @property
    def C(self) -> int:
        return self.shape[1]

    def small(self, side: int = 6) -> "GNShape":
        """Same channels and groups with a few positions, for the interpreter."""
        spatial = tuple(min(d, 2) for d in self.shape[2:-2]) + tuple(
            min(d, side) for d in self.shape[-2:]
        )
        return replace(self, shape=(self.shape[0], self.C) + spatial)


#: the norms of FLUX.1 / FLUX.2's AutoencoderKL decoder at 1024^2 (block_out_channels
#: 128/256/512/512): (name, where, x shape)
_FLUX_VAE_NORMS = [
    ("mid-128", "mid block", (1, 512, 128, 128)),
    ("up1-256", "up block 1", (1, 512, 256, 256)),
    ("up2-512", "up block 2", (1, 256, 512, 512)),
    ("out-1024", "norm_out", (1, 128, 1024, 1024)),
]


def _flux_vae(name: str, where: str, shape, compiled: bool = False) -> GNShape:
    """A FLUX VAE decoder norm; ``compiled``: the same decoder under torch.compile, whose
    inductor hands the norms channels-last activations."""
    if compiled:
        model = f"FLUX.1/2 VAE decoder compiled, {where}, channels-last"
        return GNShape(f"flux-vae-{name}-cl", model, shape, channels_last=True)
    return GNShape(f"flux-vae-{name}", f"FLUX.1/2 VAE decoder, 1024^2, {where}", shape)


GN_SHAPES = by_name(
    *(_flux_vae(*n) for n in _FLUX_VAE_NORMS),
    *(_flux_vae(*n, compiled=True) for n in _FLUX_VAE_NORMS),
    # HunyuanVideo causal 3-D VAE decoder, one tile (latent 32x32, 9 frames after upsampling)
    GNShape("hunyuan-vae-mid", "HunyuanVideo VAE decoder tile, mid block", (1, 512, 5, 32, 32)),
    GNShape("hunyuan-vae-up-9f", "HunyuanVideo VAE decoder tile, 9 frames", (1, 128, 9, 128, 128)),
    # Wan 2.1 VAE decoder (480p, one latent frame / four frames at a time, causal cache)
    GNShape(
        "wan-vae-mid-480p", "Wan2.1 VAE decoder 480p, mid block", (1, 384, 1, 60, 104), op="rms"
    ),
    GNShape(
        "wan-vae-out-480p", "Wan2.1 VAE decoder 480p, norm_out", (1, 96, 4, 480, 832), op="rms"
    ),
)


@dataclass(frozen=True)
class FullAttnShape:
    """One full (unmasked) self-attention call of a model: q, k, v (B, S, H, D), every query
    over every key, as the model's attention processor hands it to SDPA (joint attention:
    the text tokens concatenated to the image / video tokens)."""

    name: str
    model: str
    S: int
    H: int
    D: int = 128
    B: int = 1

    @property
    def flops(self) -> int:
        """Multiply-adds of Q K^T and P V, two flops each: 4 B H S^2 D."""
        return 4 * self.B * self.H * self.S * self.S * self.D

    def small(self, S: int = 40) -> "FullAttnShape":
        """The same head_dim with few tokens and two heads, for the interpreter."""
        return replace(self, S=min(S, self.S), H=min(self.H, 2))


FULL_ATTN_SHAPES = by_name(
    FullAttnShape("wan14b-480p", "Wan2.x 14B T2V 480p 81f (self-attention)", 21 * 30 * 52, 40),
    FullAttnShape("wan14b-720p", "Wan2.x 14B T2V 720p 81f (self-attention)", 21 * 45 * 80, 40),
    # 544x960, 129 frames: 33 x 34 x 60 video tokens + 256 text tokens, joint attention
    FullAttnShape("hunyuan-video-544p-129f", "HunyuanVideo 544x960 129f", 33 * 34 * 60 + 256, 24),
    FullAttnShape("flux2-1024", "FLUX.2-dev 1024^2 (joint attention)", 4096 + 512, 48),
    # head_dim 64: CogVideoX-5B at 720x480, 49 frames (13 x 30 x 45 video tokens + 226 text
    # tokens, 48 heads of 64)
    FullAttnShape(
        "cogvideox-5b-480p",
        "CogVideoX-5B 720x480 49f (joint attention)",
        13 * 30 * 45 + 226,
        48,
        64,
    ),
)
