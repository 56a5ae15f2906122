"""``import ditfuse`` without a GPU runs ditfuse's own kernels through Triton's interpreter
and leaves every other Triton kernel of the process as the environment configures it."""

import os
import subprocess
import sys
from pathlib import Path

import torch

SRC = str(Path(__file__).resolve().parents[1] / "src")

_CHILD = r"""
import os, torch, triton, triton.language as tl
from triton.runtime.jit import JITFunction
import ditfuse
from ditfuse.runtime import backend
assert "TRITON_INTERPRET" not in os.environ, "import ditfuse set TRITON_INTERPRET"

@triton.jit
def user_kernel(x_ptr):
    tl.store(x_ptr, tl.sum(tl.load(x_ptr + tl.arange(0, 4)), 0))

# a user's kernel defined after `import ditfuse` is what Triton makes of the environment
assert type(user_kernel) is JITFunction, type(user_kernel)
torch.manual_seed(0)
with torch.no_grad():
    H, D, S = 4, 32, 16
    q, k = (torch.randn(1, S, H * D, dtype=torch.bfloat16) for _ in range(2))
    norm = torch.nn.RMSNorm(H * D, eps=1e-6, dtype=torch.bfloat16)
    cos, sin = torch.randn(S, D), torch.randn(S, D)
    out = ditfuse.qk_norm_rope(q, k, cos, sin, q_norm=norm, k_norm=norm, num_heads=H)
    ref = ditfuse.qk_norm_rope_reference(q, k, cos, sin, q_norm=norm, k_norm=norm, num_heads=H)
    # a norm across heads is within one rounding of the reference (its sum order), not
    # bitwise: about 1 random input in 400 puts a pair of outputs on the other side of a tie
    assert all(torch.allclose(a, b, rtol=2**-7, atol=0) for a, b in zip(out, ref)), "qk != ref"
    x = torch.randn(2, 8, 64, dtype=torch.bfloat16)
    shift = torch.randn(2, 1, 64, dtype=torch.bfloat16)
    scale = torch.randn(2, 1, 64, dtype=torch.bfloat16)
    y = ditfuse.adaln_modulate(x, shift, scale, norm="layer")
    assert torch.isfinite(y).all()
# Triton's library functions are its own again after ditfuse's launches
assert type(tl.sum) is JITFunction and type(tl.standard._sum_combine) is JITFunction
print("ok", backend.INTERPRET)
"""


def test_no_process_wide_interpreter(tmp_path):
    script = tmp_path / "child.py"  # Triton reads a kernel's source from its file
    script.write_text(_CHILD)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(
        [SRC] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    r = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.split() == ["ok", str(not torch.cuda.is_available())], r.stdout
