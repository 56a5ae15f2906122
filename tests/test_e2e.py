"""The --e2e machinery on tiny models (CPU, stub timer): four timed variants, trajectory
PSNR (patched vs unpatched bitwise in bf16 here: infinite PSNR)."""
import math

import pytest
import torch

pytest.importorskip("diffusers")

from ditfuse import e2e  # noqa: E402
from ditfuse.patching import tiny_models as tm  # noqa: E402


def test_run_model_tiny_flux():
    rows = []
    spec = e2e.E2E_MODELS["flux1-1024"]
    _, quality, report = e2e.run_model(
        spec, "cpu", torch.bfloat16, 1, timer=lambda f: (f(), 1.0)[1], emit=rows.append,
        compile_backend="eager", steps=2, build=lambda layers: tm._flux(),
        inputs=lambda device, dtype: {k: v for k, v in tm._flux_inputs(dtype).items()})
    assert [r["impl"] for r in rows] == ["unpatched eager", "unpatched compile", "patched eager",
                                          "patched compile"]
    assert report.counts
    assert quality["max_abs_diff"] == 0.0 and math.isinf(quality["psnr"])


def test_psnr():
    a = torch.ones(4)
    assert math.isinf(e2e.psnr(a, a))
    assert abs(e2e.psnr(a * 1.1, a) - 20.0) < 1e-4
