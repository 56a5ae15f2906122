"""The sm_90 builds of the kernels whose contract has a half-precision rounding between a
multiply and an add contain no half-precision FMA. With contraction on, LLVM narrows
``round(a * g) + b`` on bf16/fp16 operands to half ops and fuses them into ``fma.rn.bf16``,
dropping the rounding the model's eager chain performs (found on the H200: Wan's VAE norm
with a bias). Compiled here for sm_90 with the Triton wheel; no GPU needed."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ditfuse.aot.compile import missing_tools

pytestmark = pytest.mark.slow  # the slow tier (CONTRIBUTING.md)

SRC = Path(__file__).resolve().parents[1] / "src"

_PROBE = r"""
import re, sys, torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ditfuse.ops import adaln
from ditfuse.ops import group_norm as gn
from ditfuse.aot.compile import intercept_launches, specialize

def ptx_of(mod, name, call):
    real = getattr(mod, name)
    [(grid, args, kw)] = intercept_launches([(mod, name)], call)
    t = GPUTarget("cuda", 90, 32)
    sig, cex, attrs, opts = specialize(real, args, kw, t)
    ck = triton.compile(ASTSource(real, sig, cex, attrs), target=t, options=opts.__dict__)
    return ck.asm["ptx"]

m = lambda *s, dt: torch.empty(*s, dtype=dt, device="meta")
for dt in (torch.bfloat16, torch.float16):
    ptxs = {
        "rms+bias": ptx_of(gn, "_rms_ch_kernel", lambda: gn.rms_norm_silu_channels(
            m(2, 40, 3, 5, dt=dt), m(40, 1, 1, dt=dt), m(40, 1, 1, dt=dt))),
        "adaln per_op": ptx_of(adaln, "_adaln_tile_kernel", lambda: adaln.gated_residual_adaln(
            m(1, 4608, 3072, dt=dt), m(1, 4608, 3072, dt=dt), m(1, 3072, dt=dt), m(1, 3072, dt=dt),
            m(1, 3072, dt=dt), rounding="per_op")),
        "residual per_op": ptx_of(adaln, "_residual_flat_kernel", lambda: adaln.gated_residual(
            m(1, 4608, 3072, dt=dt), m(1, 4608, 3072, dt=dt), m(1, 3072, dt=dt),
            rounding="per_op")),
    }
    for name, ptx in ptxs.items():
        n = len(re.findall(r"\bfma\.rn(?:\.ftz)?\.(?:bf16|f16)(?:x2)?\b", ptx))
        print(f"{name} {dt}: {n}")
"""


@pytest.mark.skipif(bool(missing_tools()), reason="no ptxas in the Triton wheel")
def test_no_half_precision_fma():
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(SRC))
    r = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    counts = dict(re.findall(r"^(.*): (\d+)$", r.stdout, re.M))
    assert len(counts) == 6, r.stdout
    assert all(v == "0" for v in counts.values()), counts
