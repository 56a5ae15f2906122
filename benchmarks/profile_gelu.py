"""FLUX.1's single-stream GELU (tanh) for Nsight Compute (no timing): ditfuse.gelu, then
PyTorch's own F.gelu(approximate="tanh") on the same (1, 4608, 12288) bf16 tensor, three
calls each (profile the third: -k regex:_act_kernel / regex:gelu, --launch-skip 2)."""
import torch
import torch.nn.functional as F

import ditfuse
from ditfuse.shapes import ACT_SHAPES

sh = ACT_SHAPES["flux1-1024"]
x = torch.randn(sh.B, sh.S, sh.N, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    ditfuse.gelu(x, "tanh")
for _ in range(3):
    F.gelu(x, approximate="tanh")
torch.cuda.synchronize()
