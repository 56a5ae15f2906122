"""SAME autoencoder (AutoencoderSAME, Stable Audio 3's VAE): band attention through
``ditfuse.sliding_window_attention`` with the DyT QK-norm and partial RoPE fused into its
prologue; the resampling blocks pass a band description instead of building the dense
(N, N) mask."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ditfuse.ops.attention import head_dim_ok, sliding_window_attention
from ditfuse.patching.common import (
    Processor,
    bind_forward,
    needs_grad,
    replace_processors,
)


@dataclass(frozen=True)
class Band:
    """Stands for ``_band_mask(N, window)``: query i sees keys j with |i - j| <= window."""

    window: int


def _make_processor():
    from diffusers.models.autoencoders import autoencoder_same as am

    class DitfuseSAMEAttnProcessor(Processor, am.SAMEAttnProcessor):
        """SAMEAttnProcessor on the banded tensor-core kernel: (differential) attention over
        the views of ``to_qkv``, DyT norm + partial RoPE applied to Q/K tiles as they load.

        Runs the fused path when the mask is a :class:`Band` (from a patched resampling
        block) or None (full attention: ``window=-1``), head_dim is one the kernel supports
        (up to 128) and no gradients are needed; otherwise the original processor (with
        the dense mask built from the band)."""

        def __call__(self, attn, hidden_states, attn_mask=None):
            ok = (
                (isinstance(attn_mask, Band) or attn_mask is None)
                and head_dim_ok(attn.dim_heads)
                and not needs_grad(attn, hidden_states)
            )
            if not ok:
                if isinstance(attn_mask, Band):  # the original code needs the dense mask
                    attn_mask = am._band_mask(
                        hidden_states.shape[1],
                        attn_mask.window,
                        hidden_states.device,
                        hidden_states.dtype,
                    )
                return super().__call__(attn, hidden_states, attn_mask=attn_mask)
            window = attn_mask.window if isinstance(attn_mask, Band) else -1
            N = hidden_states.shape[1]
            freqs = attn.rope(N, hidden_states.device).float()
            cos, sin = freqs.cos(), freqs.sin()

            def heads(x):
                return x.unflatten(-1, (attn.heads, attn.dim_heads))

            kw = dict(
                q_norm=attn.q_norm,
                k_norm=attn.k_norm,
                cos=cos,
                sin=sin,
                rope_style="half",
                rotary_dim=freqs.shape[-1],
            )
            if attn.use_differential:
                q1, q2, k1, k2, v = map(heads, attn.to_qkv(hidden_states).chunk(5, dim=-1))
                out = sliding_window_attention(q1, k1, v, window, q2=q2, k2=k2, lam=1.0, **kw)
            else:
                q, k, v = map(heads, attn.to_qkv(hidden_states).chunk(3, dim=-1))
                out = sliding_window_attention(q, k, v, window, **kw)
            return attn.to_out(out.flatten(2, 3))

    return DitfuseSAMEAttnProcessor


def _run_layers(self, x, window):
    for layer in self.transformers:
        x = layer(x, attn_mask=Band(window))
    return x


def _encode(self, x):
    """SAMETransformerResamplingBlock._encode with a :class:`Band` instead of the dense mask."""
    from diffusers.models.autoencoders.autoencoder_same import _pad_to_multiple

    B, _, T = x.shape
    S = self.stride
    x = _pad_to_multiple(x, S, dim=-1)
    T_pad = x.shape[-1]
    x = self.mapping(x).transpose(1, 2)
    N = T_pad // S
    x = x.reshape(B * N, S, self.out_channels)
    x = torch.cat([x, self.new_tokens.expand(B * N, 1, -1)], dim=1)
    sub = S + 1
    x = _run_layers(self, x.reshape(B, N * sub, self.out_channels), self.sliding_window * sub)
    x = x.reshape(B * N, sub, self.out_channels)[:, -1:, :]
    x = x.reshape(B, N, self.out_channels).transpose(1, 2)
    return x[..., : -(-T // S)]


def _decode(self, x):
    """SAMETransformerResamplingBlock._decode with a :class:`Band` instead of the dense mask."""
    B, _, T = x.shape
    S = self.stride
    x = x.transpose(1, 2).reshape(B * T, 1, self.in_channels)
    x = torch.cat([x, self.new_tokens.expand(B * T, S, -1)], dim=1)
    sub = 1 + S
    x = _run_layers(self, x.reshape(B, T * sub, self.in_channels), self.sliding_window * sub)
    x = x.reshape(B * T, sub, self.in_channels)[:, -S:, :]
    x = x.reshape(B, T * S, self.in_channels).transpose(1, 2)
    return self.mapping(x)


def _block_forward(self, x):
    return _encode(self, x) if self.mode == "encoder" else _decode(self, x)


def patch_model(model, report, *, qk_norm_rope=True, adaln=True, attention=True, activations=True):
    from diffusers.models.autoencoders.autoencoder_same import (
        SAMEAttnProcessor,
        SAMETransformerResamplingBlock,
    )

    if not attention:
        return
    replace_processors(
        model,
        report,
        {SAMEAttnProcessor: _make_processor()},
        "attention processors (band attention)",
    )
    for m in model.modules():
        if isinstance(m, SAMETransformerResamplingBlock):
            if bind_forward(m, _block_forward, report):
                report.add("resampling blocks (no dense mask)")
