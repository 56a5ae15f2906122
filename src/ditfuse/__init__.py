"""ditfuse: fused Triton kernels for diffusion-transformer inference.

Without a CUDA device, kernels run through Triton's interpreter on the CPU (set up here,
before triton is imported by any kernel module).
"""
from . import _runtime  # noqa: F401  (must come first: sets TRITON_INTERPRET when no GPU)
from .norms import NormSpec
from .qk_norm_rope import qk_norm_rope
from .reference import qk_norm_rope_reference
from .adaln import adaln_modulate, gated_residual, gated_residual_adaln
from .group_norm import group_norm_silu, rms_norm_silu_channels
from .activations import gelu, swiglu
from .attention import sliding_window_attention
from .patching import patch, unpatch
from . import _ops  # noqa: F401  (registers the torch.library ops)

__version__ = "0.1.0"

__all__ = ["NormSpec", "qk_norm_rope", "qk_norm_rope_reference", "adaln_modulate",
           "gated_residual", "gated_residual_adaln", "group_norm_silu", "rms_norm_silu_channels",
           "swiglu", "gelu", "sliding_window_attention", "patch", "unpatch", "__version__"]
