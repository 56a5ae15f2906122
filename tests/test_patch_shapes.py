"""ditfuse.patch on the tiny models at inputs the other patch tests do not use: batch 2,
one text token, odd latent sizes, several frames, padded text masks (HunyuanVideo,
Qwen-Image). Patched vs unpatched within a few roundings of the output scale (bitwise in
bf16 where the fused ops reproduce the eager arithmetic, as in test_patch.py)."""

import pytest
import torch

import ditfuse

diffusers = pytest.importorskip("diffusers")
from test_patch import _close  # noqa: E402

from ditfuse.tools.tiny_models import _flux, _flux2, _hunyuan, _qwen, _sa3, _wan, to_dtype  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        torch.cuda.is_available(), reason="the tiny models run on the CPU through the interpreter"
    ),
]


def _g(seed):
    return torch.Generator().manual_seed(seed)


def wan_inputs(dtype, B, F, H, W, T):
    g = _g(11)
    return dict(
        hidden_states=torch.randn(B, 4, F, H, W, generator=g).to(dtype),
        encoder_hidden_states=torch.randn(B, T, 16, generator=g).to(dtype),
        timestep=torch.tensor([500.0, 20.0][:B]).to(dtype),
        return_dict=False,
    )


def wan_i2v_inputs(dtype, B, F, H, W, T):
    kw = wan_inputs(dtype, B, F, H, W, T)
    kw["encoder_hidden_states_image"] = torch.randn(B, 3, 8, generator=_g(17)).to(dtype)
    return kw


def wan_ti2v_inputs(dtype, B, F, H, W, T):  # one timestep per token (Wan 2.2 TI2V)
    kw = wan_inputs(dtype, B, F, H, W, T)
    n = F * (H // 2) * (W // 2)
    kw["timestep"] = (torch.rand(B, n, generator=_g(18)) * 900 + 50).to(dtype)
    return kw


def flux_inputs(dtype, B, S, T):
    g = _g(12)
    return dict(
        hidden_states=torch.randn(B, S, 4, generator=g).to(dtype),
        encoder_hidden_states=torch.randn(B, T, 32, generator=g).to(dtype),
        pooled_projections=torch.randn(B, 32, generator=g).to(dtype),
        timestep=torch.tensor([0.5, 0.25][:B]).to(dtype),
        img_ids=torch.randn(S, 3, generator=g),
        txt_ids=torch.randn(T, 3, generator=g),
        return_dict=False,
    )


def flux2_inputs(dtype, B, S, T):
    g = _g(13)
    return dict(
        hidden_states=torch.randn(B, S, 4, generator=g).to(dtype),
        encoder_hidden_states=torch.randn(B, T, 32, generator=g).to(dtype),
        timestep=torch.tensor([0.5, 0.25][:B]).to(dtype),
        img_ids=torch.randn(1, S, 4, generator=g),
        txt_ids=torch.randn(1, T, 4, generator=g),
        guidance=torch.tensor([3.5, 2.0][:B]).to(dtype),
        return_dict=False,
    )


def hunyuan_inputs(dtype, B, F, H, W, T, pad):
    g = _g(14)
    mask = torch.ones(B, T)
    if pad:
        mask[-1, T - pad :] = 0  # the last prompt padded
    return dict(
        hidden_states=torch.randn(B, 4, F, H, W, generator=g).to(dtype),
        timestep=torch.tensor([3, 7][:B]).to(dtype),
        encoder_hidden_states=torch.randn(B, T, 16, generator=g).to(dtype),
        encoder_attention_mask=mask.to(dtype),
        pooled_projections=torch.randn(B, 8, generator=g).to(dtype),
        guidance=torch.tensor([3.0, 5.0][:B]).to(dtype),
        return_dict=False,
    )


def qwen_inputs(dtype, B, h, w, T, pad):
    g = _g(15)
    mask = torch.ones(B, T, dtype=torch.bool)
    if pad:
        mask[-1, T - pad :] = False
    return dict(
        hidden_states=torch.randn(B, h * w, 16, generator=g).to(dtype),
        encoder_hidden_states=torch.randn(B, T, 16, generator=g).to(dtype),
        encoder_hidden_states_mask=mask,
        timestep=torch.tensor([1.0, 0.5][:B]).to(dtype),
        img_shapes=[(1, h, w)] * B,
        return_dict=False,
    )


def sa3_inputs(dtype, B, L, T):
    g = _g(16)
    return dict(
        hidden_states=torch.randn(B, 8, L, generator=g).to(dtype),
        timestep=torch.tensor([0.3, 0.7][:B]).to(dtype),
        encoder_hidden_states=torch.randn(B, T, 8, generator=g).to(dtype),
        global_hidden_states=torch.randn(B, 8, generator=g).to(dtype),
        return_dict=False,
    )


CASES = [
    ("wan-b2-3frames-odd", _wan, lambda dt: wan_inputs(dt, 2, 3, 6, 10, 5)),
    ("wan-one-text-token", _wan, lambda dt: wan_inputs(dt, 1, 1, 4, 6, 1)),
    ("wan-i2v-b2", lambda: _wan(i2v=True), lambda dt: wan_i2v_inputs(dt, 2, 2, 4, 6, 5)),
    ("wan-ti2v-b2", _wan, lambda dt: wan_ti2v_inputs(dt, 2, 2, 4, 6, 5)),
    ("flux1-b2-odd", _flux, lambda dt: flux_inputs(dt, 2, 11, 3)),
    ("flux1-one-text-token", _flux, lambda dt: flux_inputs(dt, 1, 5, 1)),
    ("flux2-b2-odd", _flux2, lambda dt: flux2_inputs(dt, 2, 9, 2)),
    ("hunyuan-b2-padded-text", _hunyuan, lambda dt: hunyuan_inputs(dt, 2, 2, 3, 5, 6, 2)),
    ("qwen-b2-padded-text", _qwen, lambda dt: qwen_inputs(dt, 2, 2, 6, 5, 2)),
    ("sa3-b2-odd", _sa3, lambda dt: sa3_inputs(dt, 2, 7, 1)),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16], ids=["bf16"])  # fp32: test_patch.py
@pytest.mark.parametrize("name,make,inputs", CASES, ids=[c[0] for c in CASES])
@torch.no_grad()
def test_patched_matches_unpatched_at_other_shapes(name, make, inputs, dtype):
    model = to_dtype(make(), dtype)
    kw = inputs(dtype)
    ref = model(**kw)[0]
    report = ditfuse.patch(model)
    assert report.counts.get("attention processors (QK-norm + RoPE)", 0) > 0, report.counts
    out = model(**kw)[0]
    assert out.shape == ref.shape
    share = _close(out, ref, dtype)
    if dtype == torch.bfloat16:  # as in test_patch.py: the fused ops' arithmetic is eager's
        assert share == 1.0, f"{name}: {100 * share:.2f}% bitwise"
    ditfuse.unpatch(model)
    assert torch.equal(model(**kw)[0], ref)


# the models whose fuse_qkv_projections() fuses (diffusers 0.42: on HunyuanVideo and
# Qwen-Image it leaves every attention module unfused)
FUSED = ["wan-b2-3frames-odd", "wan-i2v-b2", "flux1-b2-odd", "flux2-b2-odd"]


@pytest.mark.parametrize(
    "name,make,inputs",
    [c for c in CASES if c[0] in FUSED],
    ids=[c[0] for c in CASES if c[0] in FUSED],
)
@torch.no_grad()
def test_patched_after_fuse_qkv_projections(name, make, inputs):
    """``model.fuse_qkv_projections()`` (one ``to_qkv`` / ``to_added_qkv`` GEMM a block, which
    the processors read through diffusers' ``_get_qkv_projections``): patched after fusing,
    bitwise the fused unpatched model in bf16."""
    dtype = torch.bfloat16
    model = to_dtype(make(), dtype)
    model.fuse_qkv_projections()
    assert any(getattr(m, "fused_projections", False) for m in model.modules()), name
    kw = inputs(dtype)
    ref = model(**kw)[0]
    report = ditfuse.patch(model)
    assert report.counts.get("attention processors (QK-norm + RoPE)", 0) > 0, report.counts
    out = model(**kw)[0]
    assert _close(out, ref, dtype) == 1.0, name
