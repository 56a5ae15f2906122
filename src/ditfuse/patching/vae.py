"""VAEs: every norm -> SiLU pair of the ResNet blocks and the encoder / decoder heads as one
kernel (``group_norm_silu`` / ``rms_norm_silu_channels``).

Covered (diffusers 0.42): ``AutoencoderKL`` and ``AutoencoderKLFlux2`` (``ResnetBlock2D``,
``Encoder`` / ``Decoder`` of ``vae.py``: GroupNorm(32, eps=1e-6) -> SiLU),
``AutoencoderKLHunyuanVideo`` (its causal 3-D ResNet blocks and heads: the same pair in 5-D),
``AutoencoderKLWan`` (Wan 2.1's and Wan 2.2's residual layout) and ``AutoencoderKLQwenImage``
(their residual blocks and heads: the channel RMS norm ``F.normalize(x, dim=1) * sqrt(C) *
gamma + bias`` -> SiLU).

How: each such block calls ``x = self.norm(x); x = self.act(x)`` and uses ``act`` nowhere
else (checked per class below). The norm modules get a forward that computes norm + SiLU
in one pass, and the block's activation module an identity forward; the modules, their
parameters and the state dict stay as they are. A block is patched whole or not at all: only
when all its norms and its activation are of the exact classes the kernels reproduce, the
activation module belongs to that block alone and no hook wraps any of them.

Under torch.compile the 4-D GroupNorm pairs (the AutoencoderKL VAEs: FLUX.1, FLUX.2) stay
on the kernel, as the ``ditfuse::group_norm_silu`` op in the graph (inductor lays the
convolutions out channels-last, which the kernel reads in place: ``group_norm_silu``'s
"split-cl" path), and the others trace the modules' own code, so that inductor fuses those
pairs with their neighbours as it does unpatched: with the 5-D pairs (channels-first under
inductor) in the graph a compiled decode was no faster (docs/design/group_norm.md); the
channel RMS is not measured compiled.

Each fused norm runs the original norm and SiLU instead when the kernels do not reproduce it
(autograd needs gradients, a device Triton cannot run on, a dtype or a parameter dtype other
than the activation's, a layout other than contiguous / channels-last, Wan's
``channel_first=False``), so the patched VAE never computes something else. Contract
(``group_norm_silu`` / ``rms_norm_silu_channels``): each pair within one rounding of the
eager modules in the activation dtype (the statistics' summation order differs; in half
precision the norm's output is rounded where the eager module rounds it, before SiLU).
"""

from __future__ import annotations

import collections

import torch
from torch import nn

from ditfuse.ops.group_norm import ACT_DTYPES, group_norm_silu, rms_norm_silu_channels
from ditfuse.patching.common import _PATCHED_FWD, bind_forward, compiling, grad_needed, hooked
from ditfuse.runtime import backend

_ACT = "_ditfuse_act"  # the norm's activation module (its class forward: the fallback's SiLU)
LABEL = "norm + SiLU pairs (one kernel)"


def _dense(x: torch.Tensor) -> bool:
    if x.is_contiguous():
        return True
    if x.dim() == 4:
        return x.is_contiguous(memory_format=torch.channels_last)
    if x.dim() == 5:
        return x.is_contiguous(memory_format=torch.channels_last_3d)
    return False


def _act(norm, y):
    act = norm.__dict__[_ACT]
    return type(act).forward(act, y)


def _param_ok(p, x) -> bool:
    return p is None or (
        isinstance(p, torch.Tensor) and p.dtype == x.dtype and p.device == x.device
    )


#: ranks of GroupNorm input that stay on the kernel under torch.compile (module docstring)
COMPILED_GN_RANKS = (4,)


def _tensor_ok(x, channels: int, compiled_ranks=()) -> bool:
    """x is an activation the kernels read in place: a dtype they compute, channels-first
    (N, C, ...) with C = ``channels``, contiguous or channels-last, on a kernel device; and
    not being compiled unless its rank is one of ``compiled_ranks``."""
    return (
        isinstance(x, torch.Tensor)
        and (not compiling() or x.dim() in compiled_ranks)
        and x.dtype in ACT_DTYPES
        and x.dim() >= 3
        and x.shape[1] == channels
        and backend.kernel_device_ok(x)
        and _dense(x)
    )


def _gn_silu_forward(self, x):
    """GroupNorm -> SiLU (the block's activation) in one kernel, else the two modules."""
    w, b = self.weight, self.bias
    if (
        _tensor_ok(x, self.num_channels, COMPILED_GN_RANKS)
        and _param_ok(w, x)
        and _param_ok(b, x)
        and not grad_needed(x, w, b)
    ):
        return group_norm_silu(x, self.num_groups, w, b, self.eps)
    return _act(self, nn.GroupNorm.forward(self, x))


def _rms_silu_forward(self, x):
    """Wan's / Qwen-Image's channel RMS norm -> SiLU in one kernel, else the two modules."""
    g, b = self.gamma, self.bias
    bias = None if isinstance(b, float) and b == 0.0 else b
    if (
        self.channel_first
        and _tensor_ok(x, g.shape[0])
        and x.dim() == g.dim() + 1
        and g.numel() == g.shape[0]
        and _param_ok(g, x)
        and (bias is None or (_param_ok(bias, x) and bias.shape == g.shape))
        and not grad_needed(x, g, bias)
    ):
        return rms_norm_silu_channels(x, g, bias, 1e-12, scale=self.scale)
    return _act(self, type(self).forward(self, x))


def _identity_forward(self, x):
    """The activation, already applied by the fused norm before it."""
    return x


def _specs():
    """{block class: (norm attributes, activation attribute, condition)}: the blocks whose
    forward calls ``act`` only right after one of the norms (diffusers 0.42's code)."""
    from diffusers.models.autoencoders import vae
    from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import (
        HunyuanVideoDecoder3D,
        HunyuanVideoEncoder3D,
        HunyuanVideoResnetBlockCausal3D,
    )
    from diffusers.models.autoencoders.autoencoder_kl_qwenimage import (
        QwenImageDecoder3d,
        QwenImageEncoder3d,
        QwenImageResidualBlock,
    )
    from diffusers.models.autoencoders.autoencoder_kl_wan import (
        WanDecoder3d,
        WanEncoder3d,
        WanResidualBlock,
    )
    from diffusers.models.resnet import ResnetBlock2D

    def resnet_ok(m) -> bool:
        # the VAEs' blocks: no time embedding (whose projection applies the activation to
        # temb too), and norm2 straight before the activation (every mode but
        # "scale_shift", which modulates between them; the decoders' up blocks say "group")
        return m.time_emb_proj is None and m.time_embedding_norm != "scale_shift"

    pair = (("norm1", "norm2"), "nonlinearity")
    return {
        ResnetBlock2D: pair + (resnet_ok,),
        vae.Encoder: (("conv_norm_out",), "conv_act", None),
        vae.Decoder: (("conv_norm_out",), "conv_act", None),
        HunyuanVideoResnetBlockCausal3D: pair + (None,),
        HunyuanVideoEncoder3D: (("conv_norm_out",), "conv_act", None),
        HunyuanVideoDecoder3D: (("conv_norm_out",), "conv_act", None),
        WanResidualBlock: pair + (None,),
        WanEncoder3d: (("norm_out",), "nonlinearity", None),
        WanDecoder3d: (("norm_out",), "nonlinearity", None),
        QwenImageResidualBlock: pair + (None,),
        QwenImageEncoder3d: (("norm_out",), "nonlinearity", None),
        QwenImageDecoder3d: (("norm_out",), "nonlinearity", None),
    }


def _norm_forward(norm):
    from diffusers.models.autoencoders.autoencoder_kl_qwenimage import QwenImageRMS_norm
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm

    if type(norm) is nn.GroupNorm:
        return _gn_silu_forward
    if type(norm) in (WanRMS_norm, QwenImageRMS_norm) and norm.channel_first:
        return _rms_silu_forward
    return None


def patch_vae(model, report) -> None:
    """Fuse every norm -> SiLU pair of ``model``'s blocks (see the module docstring)."""
    specs = _specs()
    owners = collections.Counter(id(m) for _, m in model.named_modules(remove_duplicate=False))
    for block in model.modules():
        spec = specs.get(type(block))
        if spec is None:
            continue
        names, act_name, cond = spec
        if cond is not None and not cond(block):
            continue
        act = getattr(block, act_name, None)
        norms = [getattr(block, n, None) for n in names]
        fns = [_norm_forward(n) if isinstance(n, nn.Module) else None for n in norms]
        if type(act) is not nn.SiLU or owners[id(act)] != 1 or None in fns:
            continue
        # all or nothing: a norm left unfused behind an identity activation would drop SiLU
        if any(_PATCHED_FWD in m.__dict__ or hooked(m) for m in norms + [act]):
            continue
        for norm, fn in zip(norms, fns):
            norm.__dict__[_ACT] = act
            bind_forward(norm, fn)
        bind_forward(act, _identity_forward)
        report.add(LABEL, len(norms))
