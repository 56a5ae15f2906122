"""SAME-L attention launches for Nsight Compute (no timing): the registry's same-l-8704
case (differential, 24 x 64, window 17) in bf16, the table's settings, a few calls."""
import sys

import torch

from ditfuse import attention as A
from ditfuse.shapes import ATTN_SHAPES

name = sys.argv[1] if len(sys.argv) > 1 else "same-l-8704"
dt = getattr(torch, sys.argv[2]) if len(sys.argv) > 2 else torch.bfloat16
sh = ATTN_SHAPES[name]
B, N, H, D, w = sh.B, sh.N, sh.H, sh.D, sh.window
g = torch.Generator(device="cuda").manual_seed(0)
proj = torch.randn(B, N, 5 * H * D, generator=g, device="cuda").to(dt)
q1, q2, k1, k2, v = [t.unflatten(-1, (H, D)) for t in proj.chunk(5, dim=-1)]
p = A.plan(q1, k1, v, w, q2=q2, k2=k2)
for _ in range(3):
    A.run(p)
torch.cuda.synchronize()
