"""ditfuse: fused Triton kernels for diffusion-transformer inference.

Public API: the ops (each a ``torch.library`` op too), their pure-PyTorch references, and
``patch`` / ``unpatch`` for diffusers models. Without a CUDA device ditfuse's own kernels run
through Triton's interpreter on CPU tensors (``ditfuse.runtime.backend``); other Triton code
in the process is left as the environment configures it.
"""

from ditfuse._version import __version__
from ditfuse.norms import NormSpec
from ditfuse.ops.activations import gelu, swiglu
from ditfuse.ops.adaln import adaln_modulate, gated_residual, gated_residual_adaln
from ditfuse.ops.attention import sliding_window_attention, sliding_window_attention_reference
from ditfuse.ops.attention_api import attention
from ditfuse.ops.group_norm import group_norm_silu, rms_norm_silu_channels
from ditfuse.ops.qk_norm_rope import QuantizedQK, qk_norm_rope, qk_norm_rope_reference
from ditfuse.patching import patch, unpatch

__all__ = [
    "NormSpec",
    "qk_norm_rope",
    "qk_norm_rope_reference",
    "QuantizedQK",
    "adaln_modulate",
    "gated_residual",
    "gated_residual_adaln",
    "group_norm_silu",
    "rms_norm_silu_channels",
    "swiglu",
    "gelu",
    "attention",
    "sliding_window_attention",
    "sliding_window_attention_reference",
    "patch",
    "unpatch",
    "__version__",
]
