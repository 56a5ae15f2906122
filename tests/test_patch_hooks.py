"""ditfuse.patch with diffusers hooks (the mechanism of enable_cache, group offloading and
layerwise casting): hooks installed after patch wrap the fused block forwards; blocks hooked
before patch keep their hooked forward (binding over it would drop the hook) and the report
says so; processors are replaced either way."""

import pytest
import torch

import ditfuse
from ditfuse.patching.common import HOOKED

diffusers = pytest.importorskip("diffusers")
from diffusers.hooks import HookRegistry, ModelHook  # noqa: E402

from ditfuse.tools.tiny_models import _flux, _flux_inputs, _wan, _wan_inputs, to_dtype  # noqa: E402

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the tiny models run on the CPU through the interpreter"
)


class Count(ModelHook):
    def __init__(self, calls):
        super().__init__()
        self.calls = calls

    def pre_forward(self, module, *args, **kwargs):
        self.calls.append(type(module).__name__)
        return args, kwargs


def _hook_blocks(model, calls):
    n = 0
    for m in model.modules():
        if type(m).__name__.endswith("TransformerBlock"):
            HookRegistry.check_if_exists_or_initialize(m).register_hook(Count(calls), "count")
            n += 1
    return n


CASES = [
    ("wan", _wan, _wan_inputs, "blocks (AdaLN)"),
    ("flux1", _flux, _flux_inputs, "blocks (gated residuals + norm2)"),
]


@pytest.mark.parametrize("name,make,inputs,label", CASES, ids=[c[0] for c in CASES])
@torch.no_grad()
def test_hooks_after_patch_wrap_the_fused_forwards(name, make, inputs, label):
    dtype = torch.bfloat16
    model = to_dtype(make(), dtype)
    kw = inputs(dtype)
    ref = model(**kw)[0]
    report = ditfuse.patch(model)
    assert report.counts.get(label) and HOOKED not in report.counts, report.counts
    calls = []
    n = _hook_blocks(model, calls)
    out = model(**kw)[0]
    assert len(calls) == n > 0  # every hook ran ...
    assert torch.equal(out, ref)  # ... around the fused forwards (bitwise in bf16)


@pytest.mark.slow
@pytest.mark.parametrize("name,make,inputs,label", CASES, ids=[c[0] for c in CASES])
@torch.no_grad()
def test_blocks_hooked_before_patch_keep_their_forward(name, make, inputs, label):
    dtype = torch.bfloat16
    model = to_dtype(make(), dtype)
    kw = inputs(dtype)
    calls = []
    n = _hook_blocks(model, calls)
    ref = model(**kw)[0]
    calls.clear()
    report = ditfuse.patch(model)
    assert report.counts.get(HOOKED) == n > 0, report.counts  # every hooked block
    assert label not in report.counts, report.counts
    assert report.counts.get("attention processors (QK-norm + RoPE)"), report.counts
    out = model(**kw)[0]
    assert len(calls) == n  # the hooks still run
    assert torch.equal(out, ref)
    ditfuse.unpatch(model)
    calls.clear()
    assert torch.equal(model(**kw)[0], ref) and len(calls) == n
