"""ditfuse.patch on diffusers' models (tiny configs): patched vs unpatched outputs,
unpatch restores exactly, patching twice is harmless, unknown classes are left alone."""

import pytest
import torch

import ditfuse
from ditfuse.ops.activations import SWIGLU
from ditfuse.runtime import fastpath as _fastpath
from ditfuse.tolerances import PATCHED_MODEL as TOL

diffusers = pytest.importorskip("diffusers")
from ditfuse.tools.tiny_models import CASES, _wan, _wan_inputs, to_dtype  # noqa: E402


def _close(out, ref, dtype):
    scale = ref.float().abs().max().item()
    err = (out.float() - ref.float()).abs().max().item()
    share = (out == ref).float().mean().item()
    print(
        f"{dtype}: max |patched - unpatched| {err:.3g} (output scale {scale:.3g}), "
        f"{100 * share:.1f}% bitwise"
    )
    assert err <= TOL[dtype] * scale, (err, scale)
    return share


def _spy_activations(monkeypatch):
    """Record (KIND, output width, output row stride) of every activation kernel launch."""
    from ditfuse.ops import activations as act

    seen, real = [], act._act_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(x, out, R, N, sx, so, **kw):
                seen.append((kw["KIND"], N, so))
                return real[grid](x, out, R, N, sx, so, **kw)

            return launch

    monkeypatch.setattr(act, "_act_kernel", Spy())
    # every call launches (a replay recorded by an earlier test would bypass the spy)
    monkeypatch.setattr(_fastpath, "ENABLED", False)
    return seen


#: variants of a model family already in the default tier (Wan T2V, SA3 DiT), and FLUX.1
#: (its processors patched and run in the default tier by tests/test_patch_hooks.py; the
#: slowest model in the interpreter)
_VARIANTS = ("wan-i2v", "wan-ti2v", "sa3-dit-inpaint", "flux1")


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="the tiny models run on the CPU through "
    "Triton's interpreter, which is off on a CUDA host (CPU tensors then take "
    "the reference path and no kernel launches)",
)
@pytest.mark.parametrize(
    "dtype", [pytest.param(torch.float32, marks=pytest.mark.slow), torch.bfloat16]
)  # bf16 (the bitwise claim) in the default tier
@pytest.mark.parametrize(
    "name,make,inputs,expected",
    [  # a family's variants in the slow tier
        pytest.param(*c, id=c[0], marks=pytest.mark.slow if c[0] in _VARIANTS else ())
        for c in CASES
    ],
)
@torch.no_grad()
def test_patched_matches_unpatched(name, make, inputs, expected, dtype, monkeypatch):
    from ditfuse.ops import adaln

    model = to_dtype(make(), dtype)
    kw = inputs(dtype)
    ref = model(**kw)[0]
    report = ditfuse.patch(model)
    for kind, n in expected.items():
        assert report.counts.get(kind) == n, (report.counts, kind)
    launches, real = [], adaln._launch
    monkeypatch.setattr(adaln, "_launch", lambda *a: (launches.append(a), real(*a))[1])
    acts = _spy_activations(monkeypatch)
    monkeypatch.setattr(_fastpath, "ENABLED", False)  # every launch through the spies
    out = model(**kw)[0]
    monkeypatch.undo()
    if any(
        "AdaLN" in k or "adaln" in k.lower() or "residual" in k or "modulate" in k for k in expected
    ):
        assert launches, "the patched blocks fell back to their own forward"
    if any("concat buffer" in k for k in expected):  # out= a column slice: row stride > width
        assert any(so > n for _, n, so in acts), "the fused activation fell back to act + torch.cat"
    if any("SwiGLU activations" in k for k in expected):
        assert any(kind == SWIGLU and so == n for kind, n, so in acts), (
            "the patched Flux2SwiGLU modules fell back to their own forward"
        )
    share = _close(out, ref, dtype)
    if dtype == torch.bfloat16:
        # The fused SwiGLU / GELU included: SwiGLU is the eager ops' arithmetic, and the
        # GELU agrees with torch's CPU gelu here although its tanh is evaluated otherwise
        # (where 1 + tanh cancels, x < -3, a bf16 GELU can differ by one rounding for a
        # fraction of a percent of elements: tests/test_activations.py reports the shares;
        # if that ever shows here, compare FLUX.1 within one bf16 rounding instead).
        assert share == 1.0, "in bf16 the patched model is bitwise the unpatched one"
    again = ditfuse.patch(model)
    assert not again.counts, "patching twice replaced something again"
    for _ in range(2):  # the first call of each signature records its launches, the next replays
        assert torch.equal(model(**kw)[0], out)
    assert ditfuse.unpatch(model) == sum(expected.values())
    assert torch.equal(model(**kw)[0], ref), "unpatch must restore the original outputs exactly"
    from diffusers.models.attention_processor import AttnProcessor2_0
    from diffusers.models.transformers import transformer_stable_audio3 as ts
    from diffusers.models.transformers.transformer_flux import FluxAttnProcessor
    from diffusers.models.transformers.transformer_flux2 import (
        Flux2AttnProcessor,
        Flux2ParallelSelfAttnProcessor,
    )
    from diffusers.models.transformers.transformer_hunyuan_video import HunyuanVideoAttnProcessor2_0
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    originals = (
        WanAttnProcessor,
        FluxAttnProcessor,
        Flux2AttnProcessor,
        Flux2ParallelSelfAttnProcessor,
        HunyuanVideoAttnProcessor2_0,
        AttnProcessor2_0,
        ts.StableAudio3SelfAttnProcessor,
        ts.StableAudio3CrossAttnProcessor,
    )
    from diffusers.models.transformers.transformer_qwenimage import QwenDoubleStreamAttnProcessor2_0

    originals = originals + (QwenDoubleStreamAttnProcessor2_0,)
    for m in model.modules():
        if hasattr(m, "processor"):
            assert type(m.processor) in originals
        assert "forward" not in m.__dict__


@pytest.mark.slow
@pytest.mark.parametrize("name", ["flux1", "flux2", "hunyuan-video"])
@torch.no_grad()
def test_activations_off_and_fallbacks(name, monkeypatch):
    """patch(activations=False) leaves act + torch.cat (and Flux2SwiGLU) alone; with them on,
    an activation the kernel does not compute (FLUX.2: a SwiGLU whose gate is not a SiLU;
    FLUX.1 / HunyuanVideo: act_mlp not an nn.GELU) runs the module's own code, bitwise."""
    make, inputs = {c[0]: (c[1], c[2]) for c in CASES}[name]
    model = to_dtype(make(), torch.bfloat16)
    kw = inputs(torch.bfloat16)
    ref = model(**kw)[0]
    report = ditfuse.patch(model, activations=False)
    assert not any("SwiGLU" in k or "GELU" in k for k in report.counts), report.counts
    acts = _spy_activations(monkeypatch)
    assert torch.equal(model(**kw)[0], ref) and not acts
    ditfuse.unpatch(model)
    if name == "flux2":
        for m in model.modules():
            if type(m).__name__ == "Flux2SwiGLU":
                m.gate_fn = torch.nn.GELU()
    else:  # every single block: one left on GELU would take the kernel
        for block in model.single_transformer_blocks:
            block.act_mlp = torch.nn.SiLU()
    ref = model(**kw)[0]
    ditfuse.patch(model)
    assert torch.equal(model(**kw)[0], ref) and not acts
    ditfuse.unpatch(model)


def test_pipeline_components_and_unknown_classes():
    class Pipe:  # what patch() uses of a DiffusionPipeline: .components
        def __init__(self):
            self.components = {
                "transformer": _wan(),
                "transformer_2": _wan(),
                "vae": torch.nn.Linear(2, 2),
                "scheduler": object(),
            }

    pipe = Pipe()
    report = ditfuse.patch(pipe)
    text = str(report)
    assert (
        "transformer: WanTransformer3DModel" in text
        and "transformer_2: WanTransformer3DModel" in text
    )
    assert "vae: Linear left untouched" in text
    assert "forward" not in pipe.components["vae"].__dict__
    assert ditfuse.unpatch(pipe) == 2 * 6
    with pytest.raises(TypeError, match="patch"):
        ditfuse.patch(object())


def test_processor_keeps_backend_and_parallel_config():
    model = _wan()
    attn = model.blocks[0].attn1
    attn.processor._attention_backend = "native"
    attn.processor._parallel_config = "sentinel"
    ditfuse.patch(model)
    assert attn.processor._attention_backend == "native"
    assert attn.processor._parallel_config == "sentinel"
    ditfuse.unpatch(model)


def test_grad_mode_falls_back_to_the_original_code():
    model = _wan()
    kw = _wan_inputs(torch.float32)
    ref = model(**kw)[0]
    ditfuse.patch(model)
    out = model(**kw)[0]  # grad enabled, parameters require grad: the original code runs
    assert torch.equal(out, ref) and out.requires_grad


@pytest.mark.slow
@pytest.mark.parametrize("name,make,inputs,expected", CASES, ids=[c[0] for c in CASES])
def test_compile_fullgraph_patched(name, make, inputs, expected):
    """Every patched model (fused processors and blocks) traces whole: torch.compile with
    fullgraph=True, no graph break, the eager patched output."""
    model = make()
    kw = inputs(torch.float32)
    ditfuse.patch(model)
    torch._dynamo.reset()
    with torch.no_grad():
        want = model(**kw)[0]
        got = torch.compile(model, fullgraph=True, backend="aot_eager")(**kw)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.no_grad()
def test_same_autoencoder_band_attention_without_dense_mask(dtype, monkeypatch):
    """AutoencoderSAME: band attention on the tensor-core kernel, and the dense (N, N) mask
    is never built once patched. fp32 at PyTorch's default matmul precision ("highest"):
    within 1e-5 of diffusers' own model (tf32 products: 5e-5 here)."""
    from diffusers.models.autoencoders import autoencoder_same as am

    from ditfuse.tools.tiny_models import _same, _same_inputs

    model = to_dtype(_same(), dtype)
    kw = _same_inputs(dtype)
    ref = model(**kw)[0]
    report = ditfuse.patch(model)
    assert report.counts == {
        "attention processors (band attention)": 2,
        "resampling blocks (no dense mask)": 2,
    }, report.counts

    def no_dense_mask(*a, **k):
        raise AssertionError("the patched model built a dense band mask")

    monkeypatch.setattr(am, "_band_mask", no_dense_mask)
    out = model(**kw)[0]
    monkeypatch.undo()
    scale = ref.float().abs().max().item()
    err = (out.float() - ref.float()).abs().max().item()
    # fp32: fp32-accurate products at the default precision; bf16 a few roundings
    assert torch.get_float32_matmul_precision() == "highest"
    assert err <= (1e-5 if dtype == torch.float32 else 2.0**-5) * scale, (err, scale)
    assert ditfuse.unpatch(model) == 4
    assert torch.equal(model(**kw)[0], ref)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["flux1", "qwen-image", "hunyuan-video"])
def test_inductor_writes_joint_qk_rows_in_place(name):
    """The joint-attention processors write each stream's normalised, rotated Q / K into
    its rows of the joint buffers (``out=``). Under inductor that is the mutating out= op
    on views of the joint buffers (``test_qk_library``: no functional result copied into
    the rows); the compiled model matches the patched eager one."""
    from conftest import DEVICE
    from torch._inductor.utils import run_and_get_code

    _, make, inputs, _ = next(c for c in CASES if c[0] == name)
    model = to_dtype(make(), torch.bfloat16).to(DEVICE)  # the kernels' device (GPU: CUDA)
    kw = {
        k: v.to(DEVICE) if isinstance(v, torch.Tensor) else v
        for k, v in inputs(torch.bfloat16).items()
    }
    ditfuse.patch(model)
    torch._dynamo.reset()
    with torch.no_grad():
        want = model(**kw)[0]
        got, code = run_and_get_code(torch.compile(model, fullgraph=True), **kw)
    src = "\n".join(code)
    assert "ditfuse.qk_norm_rope_out.default(" in src  # (single-stream blocks: functional)
    if name != "qwen-image":  # single-stream blocks: GELU written into the concat buffer
        assert "ditfuse.gelu_out.default(" in src and "ditfuse.copy_into.default(" in src
    # inductor's own fusions move the tiny bf16 models' outputs by up to ~2^-5.7 of their
    # scale without ditfuse (HunyuanVideo: unpatched compiled vs eager, 0.039 at scale 2)
    scale = want.float().abs().max().item()
    assert (got[0].float() - want.float()).abs().max().item() <= 2.0**-4 * scale
    torch._dynamo.reset()


@pytest.mark.slow
def test_compile_repeated_blocks_patched_wan():
    """diffusers' regional compilation of the patched (fused-forward) Wan blocks, fullgraph."""
    model = _wan()
    kw = _wan_inputs(torch.float32)
    ditfuse.patch(model)
    torch._dynamo.reset()
    with torch.no_grad():
        want = model(**kw)[0]
        model.compile_repeated_blocks(fullgraph=True, backend="aot_eager")
        got = model(**kw)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()


@torch.no_grad()
def test_unreadable_norm_falls_back_to_the_original_code():
    """A processor whose q/k norm qk_norm_rope cannot read (here SA3's half-precision
    StableAudio3RMSNorm) runs diffusers' own code: the output is the unpatched one, bitwise."""
    from ditfuse.norms import norm_readable
    from ditfuse.tools.tiny_models import _sa3, _sa3_inputs

    model = _sa3()
    norms = [m for m in model.modules() if type(m).__name__ == "StableAudio3RMSNorm"]
    assert norms and all(norm_readable(n) for n in norms)
    for n in norms:
        n.force_fp32 = False
    assert not any(norm_readable(n) for n in norms)
    assert not norm_readable(torch.nn.GroupNorm(2, 4)) and norm_readable(None)
    assert norm_readable(torch.nn.Identity()) and norm_readable(torch.nn.LayerNorm(8))
    kw = _sa3_inputs(torch.float32)
    ref = model(**kw)[0]
    assert ditfuse.patch(model).counts  # the processors are replaced ...
    assert torch.equal(model(**kw)[0], ref)  # ... and fall back call by call
