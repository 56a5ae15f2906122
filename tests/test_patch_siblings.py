"""ditfuse.patch on the diffusers models built from a covered model's attention and blocks:
SkyReels-V2 (Wan's architecture in its own classes; diffusion forcing's per-frame modulation
and block-causal mask), Wan 2.2 Animate (copies of Wan's processor and block around a face
adapter), ChronoEdit (the same copies, its own RoPE rows), Wan VACE (Wan's blocks + VACE
blocks), Chroma (FLUX.1's attention, pruned-AdaLN blocks, a text mask), HunyuanVideo
FramePack (HunyuanVideo's blocks over packed history latents with their own RoPE rows),
HunyuanVideo 1.5 (its own processor, HunyuanVideo's dual-stream block code in its own class),
and FLUX.3 (its processor's QK-norm + RoPE in fp32, one cast back; per-token modulation).
Tiny configs: patched vs unpatched within a few roundings (bitwise in bf16), the fused kernels
really launched, unpatch restores exactly."""

from collections import Counter

import pytest
import torch

import ditfuse
from ditfuse.runtime import fastpath as _fastpath

diffusers = pytest.importorskip("diffusers")
from test_patch import _close  # noqa: E402

from ditfuse.tools.tiny_models import _randomize, to_dtype  # noqa: E402

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the tiny models run on the CPU through the interpreter"
)


def _g(seed):
    return torch.Generator().manual_seed(seed)


def wan_vace():
    from diffusers import WanVACETransformer3DModel

    return _randomize(
        WanVACETransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=12,
            in_channels=4,
            out_channels=4,
            text_dim=16,
            freq_dim=256,
            ffn_dim=32,
            num_layers=3,
            cross_attn_norm=True,
            qk_norm="rms_norm_across_heads",
            rope_max_seq_len=32,
            vace_layers=[0, 2],
            vace_in_channels=8,
        )
    )


def wan_vace_inputs(dtype):
    g = _g(21)
    return dict(
        hidden_states=torch.randn(2, 4, 2, 6, 8, generator=g).to(dtype),
        timestep=torch.tensor([500.0, 30.0]).to(dtype),
        encoder_hidden_states=torch.randn(2, 5, 16, generator=g).to(dtype),
        control_hidden_states=torch.randn(2, 8, 2, 6, 8, generator=g).to(dtype),
        control_hidden_states_scale=torch.tensor([1.0, 0.5]).to(dtype),
        return_dict=False,
    )


def chroma():
    from diffusers import ChromaTransformer2DModel

    return _randomize(
        ChromaTransformer2DModel(
            patch_size=1,
            in_channels=4,
            num_layers=1,
            num_single_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            axes_dims_rope=(4, 4, 8),
            approximator_num_channels=8,
            approximator_hidden_dim=16,
            approximator_layers=1,
        )
    )


def chroma_inputs(dtype):
    g = _g(22)
    S, T = 9, 5
    mask = torch.ones(2, S + T, dtype=torch.bool)
    mask[1, 3:T] = False  # the second prompt padded
    return dict(
        hidden_states=torch.randn(2, S, 4, generator=g).to(dtype),
        encoder_hidden_states=torch.randn(2, T, 32, generator=g).to(dtype),
        timestep=torch.tensor([0.5, 0.2]).to(dtype),
        img_ids=torch.randn(S, 3, generator=g),
        txt_ids=torch.randn(T, 3, generator=g),
        attention_mask=mask,
        return_dict=False,
    )


def framepack():
    from diffusers import HunyuanVideoFramepackTransformer3DModel

    return _randomize(
        HunyuanVideoFramepackTransformer3DModel(
            in_channels=4,
            out_channels=4,
            num_attention_heads=2,
            attention_head_dim=10,
            num_layers=1,
            num_single_layers=1,
            num_refiner_layers=1,
            patch_size=2,
            patch_size_t=1,
            guidance_embeds=True,
            text_embed_dim=16,
            pooled_projection_dim=8,
            rope_axes_dim=(2, 4, 4),
            image_condition_type=None,
            has_image_proj=True,
            image_proj_dim=8,
            has_clean_x_embedder=True,
        )
    )


def framepack_inputs(dtype):
    g = _g(23)
    F, H, W = 2, 4, 4
    mask = torch.ones(1, 5)
    mask[:, 3:] = 0
    return dict(
        hidden_states=torch.randn(1, 4, F, H, W, generator=g).to(dtype),
        timestep=torch.tensor([3.0]).to(dtype),
        encoder_hidden_states=torch.randn(1, 5, 16, generator=g).to(dtype),
        encoder_attention_mask=mask.to(dtype),
        pooled_projections=torch.randn(1, 8, generator=g).to(dtype),
        image_embeds=torch.randn(1, 3, 8, generator=g).to(dtype),
        indices_latents=torch.arange(F) + 7,
        latents_clean=torch.randn(1, 4, 1, H, W, generator=g).to(dtype),
        indices_latents_clean=torch.tensor([0]),
        latents_history_2x=torch.randn(1, 4, 2, H, W, generator=g).to(dtype),
        indices_latents_history_2x=torch.tensor([1, 2]),
        latents_history_4x=torch.randn(1, 4, 4, H, W, generator=g).to(dtype),
        indices_latents_history_4x=torch.tensor([3, 4, 5, 6]),
        guidance=torch.tensor([5.0]).to(dtype),
        return_dict=False,
    )


def wan_animate():
    from diffusers import WanAnimateTransformer3DModel

    return _randomize(
        WanAnimateTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=12,
            in_channels=None,
            latent_channels=4,
            out_channels=4,
            text_dim=16,
            freq_dim=256,
            ffn_dim=32,
            num_layers=2,
            image_dim=8,
            added_kv_proj_dim=24,
            rope_max_seq_len=32,
            motion_encoder_channel_sizes={"4": 16, "8": 16, "16": 16},
            motion_encoder_size=16,
            motion_style_dim=8,
            motion_dim=4,
            motion_encoder_dim=16,
            face_encoder_hidden_dim=16,
            face_encoder_num_heads=2,
            inject_face_latents_blocks=1,
            motion_encoder_batch_size=4,
        )
    )


def wan_animate_inputs(dtype):
    g = _g(25)
    F = 2  # the pose latents have one frame fewer (the reference frame carries none)
    return dict(
        hidden_states=torch.randn(2, 12, F, 4, 6, generator=g).to(dtype),
        timestep=torch.tensor([500.0, 80.0]).to(dtype),
        encoder_hidden_states=torch.randn(2, 5, 16, generator=g).to(dtype),
        encoder_hidden_states_image=torch.randn(2, 3, 8, generator=g).to(dtype),
        pose_hidden_states=torch.randn(2, 4, F - 1, 4, 6, generator=g).to(dtype),
        face_pixel_values=torch.randn(2, 3, 5, 16, 16, generator=g).to(dtype),
        return_dict=False,
    )


def chronoedit():
    from diffusers import ChronoEditTransformer3DModel

    return _randomize(
        ChronoEditTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=12,
            in_channels=4,
            out_channels=4,
            text_dim=16,
            freq_dim=256,
            ffn_dim=32,
            num_layers=2,
            image_dim=8,
            added_kv_proj_dim=24,
            rope_max_seq_len=32,
            rope_temporal_skip_len=4,
        )
    )


def chronoedit_inputs(dtype, frames=2):
    """frames 2: the temporal-reasoning RoPE rows (positions 0 and skip_len - 1)."""
    g = _g(27)
    return dict(
        hidden_states=torch.randn(2, 4, frames, 4, 6, generator=g).to(dtype),
        timestep=torch.tensor([500.0, 80.0]).to(dtype),
        encoder_hidden_states=torch.randn(2, 5, 16, generator=g).to(dtype),
        encoder_hidden_states_image=torch.randn(2, 3, 8, generator=g).to(dtype),
        return_dict=False,
    )


def hunyuan15():
    from diffusers import HunyuanVideo15Transformer3DModel

    return _randomize(
        HunyuanVideo15Transformer3DModel(
            in_channels=9,
            out_channels=4,
            num_attention_heads=2,
            attention_head_dim=16,
            num_layers=2,
            num_refiner_layers=1,
            mlp_ratio=2.0,
            patch_size=1,
            patch_size_t=1,
            text_embed_dim=16,
            text_embed_2_dim=8,
            image_embed_dim=8,
            rope_axes_dim=(4, 6, 6),
            target_size=16,
            task_type="i2v",
        )
    )


def hunyuan15_inputs(dtype):
    g = _g(26)
    mask = torch.ones(2, 5)
    mask[1, 3:] = 0  # the second prompt padded (its tokens masked out of the joint attention)
    mask2 = torch.ones(2, 3)
    mask2[0, 2:] = 0
    return dict(
        hidden_states=torch.randn(2, 9, 2, 4, 4, generator=g).to(dtype),
        timestep=torch.tensor([500.0, 30.0]).to(dtype),
        encoder_hidden_states=torch.randn(2, 5, 16, generator=g).to(dtype),
        encoder_attention_mask=mask,
        encoder_hidden_states_2=torch.randn(2, 3, 8, generator=g).to(dtype),
        encoder_attention_mask_2=mask2,
        image_embeds=torch.randn(2, 4, 8, generator=g).to(dtype),
        return_dict=False,
    )


def flux3():
    from diffusers import Flux3Transformer2DModel

    return _randomize(
        Flux3Transformer2DModel(
            in_channels=8,
            cond_in_channels=8,
            num_layers=1,
            num_single_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=12,
            timestep_channels=32,
            axes_dims_rope=(4, 4, 4, 4),
        )
    )


def flux3_inputs(dtype):
    g = _g(27)
    S, T = 9, 5
    return dict(
        hidden_states=torch.randn(2, S, 8, generator=g).to(dtype),
        encoder_hidden_states=torch.randn(2, T, 12, generator=g).to(dtype),
        timestep=torch.tensor([0.5, 0.2]).to(dtype),
        img_ids=torch.randint(0, 4, (S, 4), generator=g),
        txt_ids=torch.randint(0, 4, (T, 4), generator=g),
        image_cond_hidden_states=torch.randn(2, 4, 8, generator=g).to(dtype),  # a reference
        image_cond_ids=torch.randint(0, 4, (4, 4), generator=g),
        return_dict=False,
    )


def skyreels(**kw):
    from diffusers import SkyReelsV2Transformer3DModel

    return _randomize(
        SkyReelsV2Transformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=12,
            in_channels=4,
            out_channels=4,
            text_dim=16,
            freq_dim=256,
            ffn_dim=32,
            num_layers=2,
            cross_attn_norm=True,
            qk_norm="rms_norm_across_heads",
            rope_max_seq_len=32,
            **kw,
        )
    )


def skyreels_inputs(dtype, df=False):
    g = _g(24)
    F = 4
    kw = dict(
        hidden_states=torch.randn(1, 4, F, 4, 6, generator=g).to(dtype),
        encoder_hidden_states=torch.randn(1, 5, 16, generator=g).to(dtype),
        return_dict=False,
    )
    if df:  # diffusion forcing: a timestep a frame, per-token modulation (B, 6, S, D)
        kw.update(
            timestep=torch.tensor([[900.0, 700.0, 300.0, 100.0]]).to(dtype),
            enable_diffusion_forcing=True,
        )
    else:
        kw["timestep"] = torch.tensor([500.0]).to(dtype)
    return kw


CASES = [
    (
        "skyreels-v2",
        skyreels,
        skyreels_inputs,
        {"attention processors (QK-norm + RoPE)": 4, "blocks (AdaLN)": 2},
    ),
    # diffusion forcing with blocks of 2 frames: the block-causal mask reaches self-attention
    (
        "skyreels-v2-df",
        lambda: skyreels(num_frame_per_block=2),
        lambda dt: skyreels_inputs(dt, df=True),
        {"attention processors (QK-norm + RoPE)": 4, "blocks (AdaLN)": 2},
    ),
    # Wan 2.2 Animate: copies of Wan's processor and block in its own module (I2V: the
    # image tokens' norm_added_k), the face adapter's cross-attention between blocks
    (
        "wan-animate",
        wan_animate,
        wan_animate_inputs,
        {"attention processors (QK-norm + RoPE)": 4, "blocks (AdaLN)": 2},
    ),
    # ChronoEdit: the same copies (I2V: norm_added_k), its temporal-skip RoPE rows at 2 frames
    (
        "chronoedit",
        chronoedit,
        chronoedit_inputs,
        {"attention processors (QK-norm + RoPE)": 4, "blocks (AdaLN)": 2},
    ),
    (
        "chronoedit-3f",
        chronoedit,
        lambda dt: chronoedit_inputs(dt, frames=3),
        {"attention processors (QK-norm + RoPE)": 4, "blocks (AdaLN)": 2},
    ),
    (
        "wan-vace",
        wan_vace,
        wan_vace_inputs,
        {"attention processors (QK-norm + RoPE)": 10, "blocks (AdaLN)": 3},
    ),
    (
        "chroma",
        chroma,
        chroma_inputs,
        {
            "attention processors (QK-norm + RoPE)": 3,
            "Chroma AdaLayerNormZeroPruned (modulate)": 2,
            "Chroma AdaLayerNormZeroSinglePruned (modulate)": 2,
        },
    ),
    # HunyuanVideo 1.5: its own processor (the joint mask built inside), HunyuanVideo's
    # dual-stream block code in its own class
    (
        "hunyuan-video-1.5",
        hunyuan15,
        hunyuan15_inputs,
        {
            "attention processors (QK-norm + RoPE)": 2,
            "blocks (gated residuals + norm2)": 2,
            "AdaLayerNormZero (modulate)": 4,
        },
    ),
    # FLUX.3: its own processor (QK-norm and RoPE in fp32, one cast back; norm_q / norm_k
    # kept in fp32 as from_pretrained loads them), per-mode and joint single blocks with
    # per-token modulation, SwiGLU feed-forwards
    (
        "flux3",
        flux3,
        flux3_inputs,
        {
            "attention processors (QK-norm + RoPE)": 5,
            "mode blocks (modulate + gated residual)": 3,
            "joint blocks (modulate + gated residuals)": 2,
            "SwiGLU activations (one kernel)": 5,
        },
    ),
    (
        "hunyuan-framepack",
        framepack,
        framepack_inputs,
        {"attention processors (QK-norm + RoPE)": 2, "blocks (gated residuals + norm2)": 1},
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.bfloat16], ids=["bf16"])  # fp32: the families' tests
@pytest.mark.parametrize("name,make,inputs,expected", CASES, ids=[c[0] for c in CASES])
@torch.no_grad()
def test_sibling_models_patched(name, make, inputs, expected, dtype, monkeypatch):
    model = to_dtype(make(), dtype)
    kw = inputs(dtype)
    ref = model(**kw)[0]
    report = ditfuse.patch(model)
    for kind, n in expected.items():
        assert report.counts.get(kind) == n, (name, report.counts)
    kernels, real = Counter(), _fastpath.launch
    monkeypatch.setattr(_fastpath, "ENABLED", False)
    monkeypatch.setattr(
        _fastpath, "launch", lambda k, *a: (kernels.update([k.fn.__name__]), real(k, *a))[1]
    )
    out = model(**kw)[0]
    assert any("qk_norm_rope" in k for k in kernels), (name, kernels)  # the fused path ran
    if any("modulate" in k or "AdaLN" in k for k in expected):
        assert any("adaln" in k for k in kernels), (name, kernels)
    if any("SwiGLU" in k for k in expected):
        assert "_act_kernel" in kernels, (name, kernels)
    share = _close(out, ref, dtype)
    if dtype == torch.bfloat16:
        assert share == 1.0, f"{name}: {100 * share:.2f}% bitwise"
    ditfuse.unpatch(model)
    assert torch.equal(model(**kw)[0], ref)


# the sibling models the patch took on last (2026-12-01; ChronoEdit 2026-12-02), traced whole
# (HunyuanVideo 1.5's model forward branches on its data -- ``torch.all(image_embeds == 0)``
# -- so its repeated blocks are compiled, as diffusers' ``compile_repeated_blocks`` does)
COMPILE_CASES = [
    c for c in CASES if c[0] in ("wan-animate", "flux3", "hunyuan-video-1.5", "chronoedit")
]


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,make,inputs,expected", COMPILE_CASES, ids=[c[0] for c in COMPILE_CASES]
)
def test_sibling_compile_fullgraph_patched(name, make, inputs, expected):
    """The patched forwards and processors trace with fullgraph=True (no graph break) and give
    the eager patched output."""
    model = make()
    kw = inputs(torch.float32)
    ditfuse.patch(model)
    torch._dynamo.reset()
    with torch.no_grad():
        want = model(**kw)[0]
        if name == "hunyuan-video-1.5":
            model.compile_repeated_blocks(fullgraph=True, backend="aot_eager")
            got = model(**kw)[0]
        else:
            got = torch.compile(model, fullgraph=True, backend="aot_eager")(**kw)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()
