"""CUDA-graph time (us) of the joint-attention models' QK-norm + RoPE as their patched
processors call it -- the text and image streams normalised with their own norms, one
``qk_norm_rope`` call each -- against one call over the joint sequence (the registry row's
form until session 11). bf16, random data, L2 flushed before every replay.

    python benchmarks/qk_joint_times.py TAG
"""
import sys

import torch

import ditfuse
from ditfuse.bench import graph_us
from ditfuse.norms import NormSpec
from ditfuse.workloads import rope_table

tag = sys.argv[1] if len(sys.argv) > 1 else "tree"
dev, dt = "cuda", torch.bfloat16
g = torch.Generator(device=dev).manual_seed(0)


def rnd(*s, scale=1.0, shift=0.0):
    return (torch.randn(*s, generator=g, device=dev) * scale + shift).to(dt)


def norm():
    return NormSpec("rms", weight=rnd(128, scale=0.5, shift=1.0), eps=1e-6)


# (name, text tokens, image tokens, heads, how the processor calls)
CASES = [("flux1-1024", 512, 4096, 24, "flux"), ("flux2-1024", 512, 4096, 48, "flux"),
         ("qwen-image-1328", 512, 83 * 83, 24, "qwen"),
         ("hunyuan-video-544p", 256, 16 * 34 * 60, 24, "hunyuan")]
for name, T, S, H, how in CASES:
    D = 128
    qt, kt, qi, ki = rnd(1, T, H, D), rnd(1, T, H, D), rnd(1, S, H, D), rnd(1, S, H, D)
    nq, nk, naq, nak = norm(), norm(), norm(), norm()
    cos, sin = rope_table(T + S, D, "interleaved", dev)
    if how == "qwen":  # packed half tables of each stream
        cos_i, sin_i = cos[T:, 0::2].contiguous(), sin[T:, 0::2].contiguous()
        cos_t, sin_t = cos[:T, 0::2].contiguous(), sin[:T, 0::2].contiguous()
    else:
        cos_t, sin_t, cos_i, sin_i = cos[:T], sin[:T], cos[T:], sin[T:]
    rot = dict(rotary_dim=D) if how == "qwen" else {}
    qa = torch.empty(1, T + S, H, D, device=dev, dtype=dt)
    ka = torch.empty_like(qa)
    q1, k1 = rnd(1, T + S, H, D), rnd(1, T + S, H, D)

    cos1, sin1 = (cos[:, 0::2].contiguous(), sin[:, 0::2].contiguous()) if rot else (cos, sin)

    def one():  # one call over the joint sequence, one norm (the registry row)
        return ditfuse.qk_norm_rope(q1, k1, cos1, sin1, q_norm=nq, k_norm=nk, **rot)

    if how == "hunyuan":  # image in place and rotated, text in place, not rotated
        def two():
            ditfuse.qk_norm_rope(qi, ki, cos_i, sin_i, q_norm=nq, k_norm=nk, inplace=True)
            return ditfuse.qk_norm_rope(qt, kt, q_norm=naq, k_norm=nak, inplace=True)
    else:  # text then image into their slices of the joint Q / K
        def two():
            ditfuse.qk_norm_rope(qt, kt, cos_t, sin_t, q_norm=naq, k_norm=nak,
                                 out=(qa[:, :T], ka[:, :T]), **rot)
            return ditfuse.qk_norm_rope(qi, ki, cos_i, sin_i, q_norm=nq, k_norm=nk,
                                        out=(qa[:, T:], ka[:, T:]), **rot)
    for form, fn in (("one call", one), ("two calls", two)):
        print(f"{tag:6s} {name:20s} {form:10s} {graph_us(fn):8.1f} us", flush=True)
