"""Qwen-Image 2.1's attention processors patched (``QwenImage21AttnProcessor`` and the flex
one share one QKV helper): the fused processor against the original on one attention module,
every way the model calls it -- plain, the prefill's KV-cache store (``extract`` with a
write slice) and its segments (text causal triangles, padded keys), the denoising steps'
``cached`` decode over the stored prefix -- bitwise in bf16, within a rounding in fp32; the
cache holds what the original stores; the kernel really runs; unpatch restores."""

from collections import Counter

import pytest
import torch

import ditfuse
from ditfuse.patching import qwen as _qwen
from ditfuse.runtime import fastpath as _fastpath

pytest.importorskip("diffusers")
t21 = pytest.importorskip("diffusers.models.transformers.transformer_qwenimage21")

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="runs on the CPU through the interpreter"
)

H, D, DIM = 3, 16, 40


def _attn(dtype, flex=False):
    g = torch.Generator().manual_seed(5)
    proc = t21.QwenImage21FlexAttnProcessor() if flex else t21.QwenImage21AttnProcessor()
    attn = t21.QwenImage21Attention(DIM, H, D, processor=proc)
    for p in attn.parameters():
        p.data.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    return attn.to(dtype).eval()


def _freqs(S, g):
    ang = torch.rand(S, D // 2, generator=g, dtype=torch.float64) * 6.3
    return torch.polar(torch.ones_like(ang), ang).to(torch.complex64)


def _calls(dtype):
    """(name, kwargs list run in order on one cache): what the model passes."""
    g = torch.Generator().manual_seed(6)
    B, P, S = 2, 7, 5  # prefix tokens (text 4 + condition image 3), target image tokens
    x = torch.randn(B, P + S, DIM, generator=g).to(dtype)
    key_valid = torch.ones(B, P + S, dtype=torch.bool)
    key_valid[1, 2:4] = False  # the second prompt's padded text keys
    segments = [(0, 4, True), (4, P, False)]
    prefill = dict(
        hidden_states=x,
        rotary_emb=_freqs(P + S, g),
        kv_cache_mode="extract",
        cache_write_slice=slice(0, P),
        segments=segments,
        key_valid=key_valid,
    )
    decode = dict(
        hidden_states=torch.randn(B, S, DIM, generator=g).to(dtype),
        rotary_emb=_freqs(S, g),
        kv_cache_mode="cached",
    )
    plain = dict(
        hidden_states=torch.randn(1, 6, DIM, generator=g).to(dtype), rotary_emb=_freqs(6, g)
    )
    norope = dict(hidden_states=torch.randn(1, 6, DIM, generator=g).to(dtype))
    return [("plain", [plain]), ("no-rope", [norope]), ("prefill+decode", [prefill, decode])]


def _run(attn, calls):
    cache = t21.QwenImage21KVLayerCache()
    outs = []
    for kw in calls:
        kw = dict(kw)
        if "kv_cache_mode" in kw:
            kw["layer_cache"] = cache
        outs.append(attn(**kw))
    return outs, cache


@pytest.mark.parametrize("flex", [False, True], ids=["sdpa", "flex"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@torch.no_grad()
def test_qwen21_processor_fused(dtype, flex, monkeypatch):
    """``flex``: the flex processor's calls without a BlockMask (its decode steps; the prefill
    with a BlockMask needs a compiled flex_attention), the prefill's cache store included."""
    attn = _attn(dtype, flex)
    base = type(attn.processor)
    kernels, real = Counter(), _fastpath.launch
    monkeypatch.setattr(_fastpath, "ENABLED", False)
    monkeypatch.setattr(
        _fastpath, "launch", lambda k, *a: (kernels.update([k.fn.__name__]), real(k, *a))[1]
    )
    for name, calls in _calls(dtype):
        if flex:  # no segments: the flex processor takes its prefill structure as a BlockMask
            calls = [
                {k: v for k, v in kw.items() if k not in ("segments", "key_valid")} for kw in calls
            ]
        ref, ref_cache = _run(attn, calls)
        assert not kernels
        fused_proc = _qwen._make_processor_21(base)()
        orig = attn.processor
        attn.set_processor(fused_proc)
        got, got_cache = _run(attn, calls)
        attn.set_processor(orig)
        assert any("qk_norm_rope" in k for k in kernels), (name, kernels)
        kernels.clear()
        pairs = list(zip(got, ref))
        if ref_cache.k is not None:  # the stored prefix K (post-norm, post-RoPE) and V
            pairs += [(got_cache.k, ref_cache.k), (got_cache.v, ref_cache.v)]
        for a, b in pairs:
            assert a.shape == b.shape and a.dtype == b.dtype
            if dtype == torch.bfloat16:
                assert torch.equal(a, b), (name, (a != b).float().mean().item())
            else:
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_qwen21_model_patched_and_unpatched():
    """The model's every attention (both processor classes) replaced, the originals back
    after unpatch; its blocks left alone."""
    model = t21.QwenImage21Transformer2DModel(
        in_channels=8,
        num_layers=2,
        attention_head_dim=D,
        num_attention_heads=H,
        context_in_dim=12,
        axes_dims_rope=(4, 6, 6),
    )
    model.transformer_blocks[1].attn.set_processor(t21.QwenImage21FlexAttnProcessor())
    before = [type(b.attn.processor) for b in model.transformer_blocks]
    report = ditfuse.patch(model)
    assert report.counts == {"attention processors (QK-norm + RoPE)": 2}, report.counts
    after = [type(b.attn.processor) for b in model.transformer_blocks]
    assert [issubclass(a, b) and a is not b for a, b in zip(after, before)] == [True, True]
    assert ditfuse.unpatch(model) == 2
    assert [type(b.attn.processor) for b in model.transformer_blocks] == before


@torch.no_grad()
def test_qwen21_falls_back_without_complex_table(monkeypatch):
    """A real (cos, sin) RoPE or a table of other rows is not what the fused path reads: the
    original processor runs (the same result, no kernel)."""
    attn = _attn(torch.bfloat16)
    x = torch.randn(1, 6, DIM, generator=torch.Generator().manual_seed(8)).bfloat16()
    freqs = _freqs(7, torch.Generator().manual_seed(9))  # 7 rows for 6 tokens: the original's error
    attn.set_processor(_qwen._make_processor_21(t21.QwenImage21AttnProcessor)())
    seen = []
    monkeypatch.setattr(_fastpath, "launch", lambda *a: seen.append(a))
    with pytest.raises(RuntimeError):
        attn(hidden_states=x, rotary_emb=freqs)
    assert not seen


@pytest.mark.slow
def test_qwen21_processor_compiles_fullgraph():
    """The fused processor (its projection proxy included) traces with fullgraph=True and
    gives the eager fused output, at every call mode."""
    attn = _attn(torch.float32)
    attn.set_processor(_qwen._make_processor_21(t21.QwenImage21AttnProcessor)())
    for name, calls in _calls(torch.float32):
        torch._dynamo.reset()
        with torch.no_grad():
            want, _ = _run(attn, calls)
            got, _ = _run(torch.compile(attn, fullgraph=True, backend="aot_eager"), calls)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=name)
    torch._dynamo.reset()
