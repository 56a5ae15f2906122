"""ditfuse.qk_norm_rope against diffusers' own attention code.

Where feasible the *real* diffusers attention processor runs: its ``dispatch_attention_fn``
(or ``F.scaled_dot_product_attention``) is replaced by a recorder that keeps the query/key
it is handed (normalised and rotated by diffusers' own code), and a forward pre-hook on the
norm modules keeps their inputs, which are exactly what ``ditfuse.qk_norm_rope`` receives.
Nothing of the processors is copied here; where no processor fits (FLUX with diffusers'
``RMSNorm``, packed QKV in place) diffusers' exported functions are called directly.

Tolerance: within one rounding of the activation dtype, ``|ours - theirs| <= tol * |theirs|
+ tol * rms(theirs)`` (the absolute term covers rotated outputs that cancel to near zero),
plus a floor on the share of bitwise-equal elements. Run with ``-s`` to see the shares.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("diffusers")

import ditfuse  # noqa: E402  (after the interpreter is set up)
from ditfuse.tolerances import DIFFUSERS_QK, DIFFUSERS_QK_MIN_EQUAL  # noqa: E402

# one rounding of the activation dtype; the floor on the share of bitwise-equal elements
TOL, MIN_EQUAL = DIFFUSERS_QK, DIFFUSERS_QK_MIN_EQUAL
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
DTYPE_IDS = ["bf16", "fp16", "fp32"]
# Both diffusers' eager code and ditfuse run here: the GPU when there is one (ditfuse's
# Triton kernel), else the CPU (ditfuse's kernel through Triton's interpreter).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _bits(t):
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def bitwise_share(a, b):
    return (_bits(a) == _bits(b)).float().mean().item()


def check(ours, theirs, dtype, what, record, rounds=1, min_equal=None):
    """Assert ``ours`` is within ``rounds`` roundings of ``theirs``; print and record the
    share of bitwise-equal elements and assert it reaches ``min_equal``."""
    assert ours.shape == theirs.shape, (what, tuple(ours.shape), tuple(theirs.shape))
    assert ours.dtype == theirs.dtype == dtype, (what, ours.dtype, theirs.dtype)
    eq = bitwise_share(ours, theirs)
    o, t = ours.float(), theirs.float()
    assert torch.isfinite(o).all(), what
    tol = rounds * TOL[dtype]
    rms = t.pow(2).mean().sqrt().item()
    maxd = (o - t).abs().max().item()
    name = f"{what}[{DTYPE_IDS[DTYPES.index(dtype)]}]"
    print(f"\n  {name:28s} bitwise-equal {eq:.4f}   max|diff| {maxd:.3g}  (rms {rms:.3g})")
    record(f"bitwise_equal {name}", round(eq, 4))
    torch.testing.assert_close(o, t, rtol=tol, atol=tol * rms, msg=lambda m: f"{name}: {m}")
    floor = MIN_EQUAL[dtype] if min_equal is None else min_equal
    assert eq >= floor, f"{name}: only {eq:.4f} of the elements are bitwise equal (< {floor})"
    return eq


def randomize_(p, g, scale=0.5, shift=1.0):
    """Fill parameter ``p`` with shift + scale * N(0, 1) (non-unit norm weights)."""
    with torch.no_grad():
        p.copy_((torch.randn(p.shape, generator=g) * scale + shift).to(p.dtype))


def randn(g, *shape, dtype):
    return torch.randn(*shape, generator=g).to(dtype).to(DEVICE)


class Recorder:
    """Stands in for diffusers' attention call: records (query, key), returns value."""

    def __init__(self):
        self.calls = []

    def __call__(self, query, key, value, *args, **kwargs):
        self.calls.append((query.clone(), key.clone()))
        return value


def record_inputs(module):
    """Forward pre-hook keeping every input ``module`` is called with (a list).

    The tensors themselves are kept, not copies, so their strides (e.g. a chunk of a fused
    QKV projection) reach ditfuse as they reached the norm; the processors never write to
    their norm inputs.
    """
    store = []
    module.register_forward_pre_hook(lambda m, args: store.append(args[0]))
    return store


# ---------------------------------------------------------------------------------------
# 1. Wan: torch.nn.RMSNorm across all heads (H*D), interleaved RoPE, real WanAttnProcessor


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_wan_attn_processor(dtype, monkeypatch, record_property):
    from diffusers.models.transformers import transformer_wan as tw

    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    B, H, D = 2, 3, 128  # 3 heads: the across-heads statistic spans a non-power-of-two row
    attn = tw.WanAttention(
        dim=H * D, heads=H, dim_head=D, eps=1e-6, processor=tw.WanAttnProcessor()
    )
    assert isinstance(attn.norm_q, torch.nn.RMSNorm) and attn.norm_q.weight.numel() == H * D
    randomize_(attn.norm_q.weight, g)
    randomize_(attn.norm_k.weight, g)
    attn.to(DEVICE, dtype)
    rope = tw.WanRotaryPosEmbed(D, (1, 2, 2), max_seq_len=1024).to(DEVICE)
    cos, sin = rope(torch.zeros(B, 4, 2, 4, 6, device=DEVICE))  # (1, 12, 1, D) fp32
    assert cos.dtype == torch.float32 and cos.shape[2] == 1
    S = cos.shape[1]
    rec = Recorder()
    monkeypatch.setattr(tw, "dispatch_attention_fn", rec)
    q_in, k_in = record_inputs(attn.norm_q), record_inputs(attn.norm_k)
    x = randn(g, B, S, H * D, dtype=dtype)
    with torch.no_grad():
        attn(x, rotary_emb=(cos, sin))
        ((tq, tk),) = rec.calls
        oq, ok = ditfuse.qk_norm_rope(
            q_in[0], k_in[0], cos, sin, q_norm=attn.norm_q, k_norm=attn.norm_k, num_heads=H
        )
    assert q_in[0].shape == (B, S, H * D)
    check(oq, tq.flatten(2), dtype, "wan q", record_property)
    check(ok, tk.flatten(2), dtype, "wan k", record_property)


# ---------------------------------------------------------------------------------------
# 2. FLUX: per-head norm + apply_rotary_emb(use_real_unbind_dim=-1, sequence_dim=1)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_flux_attn_processor(dtype, monkeypatch, record_property):
    """The real FluxAttnProcessor (single-stream block; its norm_q is torch.nn.RMSNorm(D))."""
    from diffusers.models.transformers import transformer_flux as tf

    g = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    B, H, D = 1, 3, 64
    attn = tf.FluxAttention(
        query_dim=H * D, heads=H, dim_head=D, bias=True, eps=1e-6, pre_only=True
    )
    randomize_(attn.norm_q.weight, g)
    randomize_(attn.norm_k.weight, g)
    attn.to(DEVICE, dtype)
    grid = torch.meshgrid(torch.zeros(1), torch.arange(3.0), torch.arange(4.0), indexing="ij")
    ids = torch.stack(grid, -1).reshape(-1, 3).to(DEVICE)
    cos, sin = tf.FluxPosEmbed(theta=10000, axes_dim=[16, 24, 24])(ids)  # (S, D) fp32
    S = cos.shape[0]
    rec = Recorder()
    monkeypatch.setattr(tf, "dispatch_attention_fn", rec)
    q_in, k_in = record_inputs(attn.norm_q), record_inputs(attn.norm_k)
    x = randn(g, B, S, H * D, dtype=dtype)
    with torch.no_grad():
        attn(x, image_rotary_emb=(cos, sin))
        ((tq, tk),) = rec.calls
        oq, ok = ditfuse.qk_norm_rope(
            q_in[0], k_in[0], cos, sin, q_norm=attn.norm_q, k_norm=attn.norm_k
        )
    check(oq, tq, dtype, "flux q", record_property)
    check(ok, tk, dtype, "flux k", record_property)


def _flux_rms_setup(dtype, g, D):
    from diffusers.models.normalization import RMSNorm

    norms = []
    for _ in range(2):
        n = RMSNorm(D, eps=1e-6)
        randomize_(n.weight, g)
        norms.append(n.to(DEVICE, dtype))
    return norms


def _flux_rope(x, cos, sin):
    from diffusers.models.embeddings import apply_rotary_emb

    return apply_rotary_emb(x, (cos, sin), use_real=True, use_real_unbind_dim=-1, sequence_dim=1)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_flux_diffusers_rmsnorm(dtype, record_property):
    """diffusers' RMSNorm(D) per head (rounds before its half-precision weight)."""
    from diffusers.models.embeddings import get_1d_rotary_pos_embed

    g = torch.Generator().manual_seed(2)
    B, S, H, D = 2, 9, 3, 64
    nq, nk = _flux_rms_setup(dtype, g, D)
    cos, sin = get_1d_rotary_pos_embed(D, S, use_real=True, repeat_interleave_real=True)
    cos, sin = cos.to(DEVICE), sin.to(DEVICE)
    q, k = randn(g, B, S, H, D, dtype=dtype), randn(g, B, S, H, D, dtype=dtype)
    with torch.no_grad():
        tq, tk = _flux_rope(nq(q), cos, sin), _flux_rope(nk(k), cos, sin)
        oq, ok = ditfuse.qk_norm_rope(q, k, cos, sin, q_norm=nq, k_norm=nk)
    check(oq, tq, dtype, "flux-rmsnorm q", record_property)
    check(ok, tk, dtype, "flux-rmsnorm k", record_property)


@pytest.mark.parametrize("form", ["bshd", "flat"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_flux_packed_qkv_inplace(dtype, form, record_property):
    """Q and K as strided slices of one packed QKV projection, rewritten in place; V untouched."""
    from diffusers.models.embeddings import get_1d_rotary_pos_embed

    g = torch.Generator().manual_seed(3)
    B, S, H, D = 2, 7, 2, 64
    HD = H * D
    nq, nk = _flux_rms_setup(dtype, g, D)
    cos, sin = get_1d_rotary_pos_embed(D, S, use_real=True, repeat_interleave_real=True)
    cos, sin = cos.to(DEVICE), sin.to(DEVICE)
    qkv = randn(g, B, S, 3 * HD, dtype=dtype)
    v_bits = _bits(qkv[..., 2 * HD :]).clone()
    q4, k4 = qkv[..., :HD].unflatten(-1, (H, D)), qkv[..., HD : 2 * HD].unflatten(-1, (H, D))
    assert not q4.is_contiguous()
    with torch.no_grad():
        tq, tk = _flux_rope(nq(q4), cos, sin), _flux_rope(nk(k4), cos, sin)
        if form == "bshd":
            q, k, kw = q4, k4, {}
        else:
            q, k, kw = qkv[..., :HD], qkv[..., HD : 2 * HD], {"num_heads": H}
        oq, ok = ditfuse.qk_norm_rope(q, k, cos, sin, q_norm=nq, k_norm=nk, inplace=True, **kw)
    assert oq is q and ok is k
    assert torch.equal(_bits(qkv[..., 2 * HD :]), v_bits), "V slice of the packed QKV was modified"
    check(q4, tq, dtype, f"flux-packed-{form} q", record_property)
    check(k4, tk, dtype, f"flux-packed-{form} k", record_property)


# ---------------------------------------------------------------------------------------
# 3. Stable Audio 3: StableAudio3RMSNorm(D) + rotate-half partial RoPE, real processor


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_stable_audio3_attn_processor(dtype, monkeypatch, record_property):
    from diffusers.models.transformers import transformer_stable_audio3 as sa

    g = torch.Generator().manual_seed(4)
    torch.manual_seed(4)
    B, H, D, S = 2, 2, 64, 11
    attn = sa.StableAudio3SelfAttention(H * D, dim_heads=D, use_differential=True)
    randomize_(attn.q_norm.gamma, g)
    randomize_(attn.k_norm.gamma, g)
    attn.to(DEVICE, dtype)
    freqs = sa.StableAudio3RotaryEmbedding(D // 2).to(DEVICE)(S, torch.device(DEVICE))  # angles
    R = freqs.shape[-1]
    assert R == D // 2  # partial rotary: the last D/2 channels pass through
    rec = Recorder()
    monkeypatch.setattr(sa, "dispatch_attention_fn", rec)
    q_in, k_in = record_inputs(attn.q_norm), record_inputs(attn.k_norm)
    x = randn(g, B, S, H * D, dtype=dtype)
    with torch.no_grad():
        attn(x, rope=freqs)
        assert len(rec.calls) == 2  # differential attention: (q1, k1) and (q2, k2)
        for i, (tq, tk) in enumerate(rec.calls):
            assert not q_in[i].is_contiguous()  # a chunk of the fused to_qkv output
            oq, ok = ditfuse.qk_norm_rope(
                q_in[i],
                k_in[i],
                freqs.cos(),
                freqs.sin(),
                q_norm=attn.q_norm,
                k_norm=attn.k_norm,
                rope_style="half",
                rotary_dim=R,
            )
            check(oq, tq, dtype, f"sa3 q{i + 1}", record_property)
            check(ok, tk, dtype, f"sa3 k{i + 1}", record_property)


# ---------------------------------------------------------------------------------------
# 4. SAME: DynamicTanh(D) + rotate-half partial RoPE over 32 of 64 channels, real processor


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_same_attn_processor(dtype, monkeypatch, record_property):
    from diffusers.models.autoencoders import autoencoder_same as sm

    g = torch.Generator().manual_seed(5)
    torch.manual_seed(5)
    B, H, D, S = 2, 3, 64, 10
    attn = sm.SAMEAttention(H * D, dim_heads=D, use_differential=True)
    for n in (attn.q_norm, attn.k_norm):
        randomize_(n.alpha, g, 0.3, 1.0)
        randomize_(n.gamma, g)
        randomize_(n.beta, g, 0.3, 0.0)
    attn.to(DEVICE, dtype)
    rec = Recorder()
    monkeypatch.setattr(sm, "dispatch_attention_fn", rec)
    q_in, k_in = record_inputs(attn.q_norm), record_inputs(attn.k_norm)
    x = randn(g, B, S, H * D, dtype=dtype)
    with torch.no_grad():
        attn(x)
        freqs = attn.rope(S, x.device)  # what the processor rotates by (its rope module's dtype)
        R = freqs.shape[-1]
        assert R == 32
        cos, sin = freqs.float().cos(), freqs.float().sin()
        assert len(rec.calls) == 2
        for i, (tq, tk) in enumerate(rec.calls):
            oq, ok = ditfuse.qk_norm_rope(
                q_in[i],
                k_in[i],
                cos,
                sin,
                q_norm=attn.q_norm,
                k_norm=attn.k_norm,
                rope_style="half",
                rotary_dim=R,
            )
            if dtype == torch.float32:
                check(oq, tq, dtype, f"same q{i + 1}", record_property)
                check(ok, tk, dtype, f"same k{i + 1}", record_property)
                continue
            # the half-precision module as is: it rounds after alpha * x, tanh, * gamma and
            # + beta, and so does ditfuse for a 16-bit DynamicTanh (round_before_weight)
            check(oq, tq, dtype, f"same q{i + 1}", record_property, min_equal=0.95)
            check(ok, tk, dtype, f"same k{i + 1}", record_property, min_equal=0.95)


# ---------------------------------------------------------------------------------------
# 5a. Qwen-Image: diffusers RMSNorm(D) on both streams, complex RoPE (use_real=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_qwenimage_attn_processor(dtype, monkeypatch, record_property):
    from diffusers.models.attention_processor import Attention
    from diffusers.models.transformers import transformer_qwenimage as tq_

    g = torch.Generator().manual_seed(6)
    torch.manual_seed(6)
    B, H, D, T = 1, 2, 64, 5
    attn = Attention(
        query_dim=H * D,
        cross_attention_dim=None,
        added_kv_proj_dim=H * D,
        dim_head=D,
        heads=H,
        out_dim=H * D,
        context_pre_only=False,
        bias=True,
        processor=tq_.QwenDoubleStreamAttnProcessor2_0(),
        qk_norm="rms_norm",
        eps=1e-6,
    )
    norms = (attn.norm_q, attn.norm_k, attn.norm_added_q, attn.norm_added_k)
    for n in norms:
        randomize_(n.weight, g)
    attn.to(DEVICE, dtype)
    rope = tq_.QwenEmbedRope(theta=10000, axes_dim=[16, 24, 24], scale_rope=True)
    img_freqs, txt_freqs = rope([(1, 3, 4)], torch.device(DEVICE), max_txt_seq_len=T)  # complex64
    S = img_freqs.shape[0]
    rec = Recorder()
    monkeypatch.setattr(tq_, "dispatch_attention_fn", rec)
    ins = [record_inputs(n) for n in norms]
    img, txt = randn(g, B, S, H * D, dtype=dtype), randn(g, B, T, H * D, dtype=dtype)
    with torch.no_grad():
        attn(img, encoder_hidden_states=txt, image_rotary_emb=(img_freqs, txt_freqs))
        ((jq, jk),) = rec.calls  # joint = [text, image] along the sequence
        # unique frequencies (D/2 wide), read straight from the complex table (stride 2)
        oq_i, ok_i = ditfuse.qk_norm_rope(
            ins[0][0],
            ins[1][0],
            img_freqs.real,
            img_freqs.imag,
            q_norm=attn.norm_q,
            k_norm=attn.norm_k,
            rotary_dim=D,
        )
        oq_t, ok_t = ditfuse.qk_norm_rope(
            ins[2][0],
            ins[3][0],
            txt_freqs.real,
            txt_freqs.imag,
            q_norm=attn.norm_added_q,
            k_norm=attn.norm_added_k,
            rotary_dim=D,
        )
    check(torch.cat([oq_t, oq_i], 1), jq, dtype, "qwen q", record_property)
    check(torch.cat([ok_t, ok_i], 1), jk, dtype, "qwen k", record_property)


# ---------------------------------------------------------------------------------------
# 5b. HunyuanVideo single-stream: diffusers RMSNorm(D); RoPE on the image tokens only


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_hunyuanvideo_attn_processor(dtype, monkeypatch, record_property):
    from diffusers.models.attention_processor import Attention
    from diffusers.models.transformers import transformer_hunyuan_video as hv

    g = torch.Generator().manual_seed(7)
    torch.manual_seed(7)
    B, H, D, T = 2, 2, 64, 4
    attn = Attention(
        query_dim=H * D,
        cross_attention_dim=None,
        dim_head=D,
        heads=H,
        out_dim=H * D,
        bias=True,
        processor=hv.HunyuanVideoAttnProcessor2_0(),
        qk_norm="rms_norm",
        eps=1e-6,
        pre_only=True,
    )
    randomize_(attn.norm_q.weight, g)
    randomize_(attn.norm_k.weight, g)
    attn.to(DEVICE, dtype)
    rope = hv.HunyuanVideoRotaryPosEmbed(patch_size=2, patch_size_t=1, rope_dim=[16, 24, 24])
    cos, sin = rope(torch.zeros(B, 4, 2, 4, 4, device=DEVICE))  # (S, D) fp32
    S = cos.shape[0]
    rec = Recorder()
    monkeypatch.setattr(hv, "dispatch_attention_fn", rec)
    q_in, k_in = record_inputs(attn.norm_q), record_inputs(attn.norm_k)
    img, txt = randn(g, B, S, H * D, dtype=dtype), randn(g, B, T, H * D, dtype=dtype)
    with torch.no_grad():
        attn(img, encoder_hidden_states=txt, image_rotary_emb=(cos, sin))
        ((tq, tk),) = rec.calls
        q, k = q_in[0], k_in[0]  # (B, S + T, H, D): image tokens first
        oq_i, ok_i = ditfuse.qk_norm_rope(
            q[:, :S], k[:, :S], cos, sin, q_norm=attn.norm_q, k_norm=attn.norm_k
        )
        oq_t, ok_t = ditfuse.qk_norm_rope(
            q[:, S:], k[:, S:], q_norm=attn.norm_q, k_norm=attn.norm_k
        )
    check(torch.cat([oq_i, oq_t], 1), tq, dtype, "hunyuanvideo q", record_property)
    check(torch.cat([ok_i, ok_t], 1), tk, dtype, "hunyuanvideo k", record_property)


# ---------------------------------------------------------------------------------------
# 5c. (B, H, S, D) layout. (diffusers 0.42's HunyuanVideo processor above works in
# (B, S, H, D) with sequence_dim=1.) diffusers RMSNorm(D) + apply_rotary_emb with its
# default sequence_dim=2, as HunyuanDiT's processor calls it on (B, H, S, D) views, and the
# real CogVideoX processor (LayerNorm(D) per head, RoPE on the video tokens after the text)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_bhsd_diffusers_rmsnorm(dtype, record_property):
    from diffusers.models.embeddings import apply_rotary_emb, get_1d_rotary_pos_embed

    g = torch.Generator().manual_seed(8)
    B, S, H, D = 2, 13, 2, 64
    nq, nk = _flux_rms_setup(dtype, g, D)
    cos, sin = get_1d_rotary_pos_embed(D, S, use_real=True, repeat_interleave_real=True)
    cos, sin = cos.to(DEVICE), sin.to(DEVICE)
    # (B, H, S, D) views of (B, S, H*D) projections, as processors build them
    q = randn(g, B, S, H * D, dtype=dtype).unflatten(-1, (H, D)).transpose(1, 2)
    k = randn(g, B, S, H * D, dtype=dtype).unflatten(-1, (H, D)).transpose(1, 2)
    with torch.no_grad():
        tq = apply_rotary_emb(nq(q), (cos, sin))  # use_real=True, unbind -1, sequence_dim=2
        tk = apply_rotary_emb(nk(k), (cos, sin))
        oq, ok = ditfuse.qk_norm_rope(q, k, cos, sin, q_norm=nq, k_norm=nk, layout="bhsd")
    check(oq, tq, dtype, "bhsd-rmsnorm q", record_property)
    check(ok, tk, dtype, "bhsd-rmsnorm k", record_property)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_cogvideox_attn_processor(dtype, monkeypatch, record_property):
    from diffusers.models import attention_processor as ap
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    g = torch.Generator().manual_seed(9)
    torch.manual_seed(9)
    B, H, D, T = 1, 2, 64, 3
    attn = ap.Attention(
        query_dim=H * D,
        dim_head=D,
        heads=H,
        qk_norm="layer_norm",
        eps=1e-6,
        bias=True,
        out_bias=True,
        processor=ap.CogVideoXAttnProcessor2_0(),
    )
    assert isinstance(attn.norm_q, torch.nn.LayerNorm)
    for n in (attn.norm_q, attn.norm_k):
        randomize_(n.weight, g)
        randomize_(n.bias, g, 0.3, 0.0)
    attn.to(DEVICE, dtype)
    cos, sin = get_3d_rotary_pos_embed(
        D, ((0, 0), (2, 3)), (2, 3), 2, use_real=True, device=torch.device(DEVICE)
    )  # (S, D) fp32
    S = cos.shape[0]
    rec = Recorder()
    monkeypatch.setattr(ap.F, "scaled_dot_product_attention", rec)
    q_in, k_in = record_inputs(attn.norm_q), record_inputs(attn.norm_k)
    img, txt = randn(g, B, S, H * D, dtype=dtype), randn(g, B, T, H * D, dtype=dtype)
    with torch.no_grad():
        attn(img, encoder_hidden_states=txt, image_rotary_emb=(cos, sin))
        ((tq, tk),) = rec.calls
        q, k = q_in[0], k_in[0]  # (B, H, T + S, D): text tokens first
        assert q.shape == (B, H, T + S, D)
        oq_i, ok_i = ditfuse.qk_norm_rope(
            q[:, :, T:],
            k[:, :, T:],
            cos,
            sin,
            q_norm=attn.norm_q,
            k_norm=attn.norm_k,
            layout="bhsd",
        )
        oq_t, ok_t = ditfuse.qk_norm_rope(
            q[:, :, :T], k[:, :, :T], q_norm=attn.norm_q, k_norm=attn.norm_k, layout="bhsd"
        )
    check(torch.cat([oq_t, oq_i], 2), tq, dtype, "cogvideox q", record_property)
    check(torch.cat([ok_t, ok_i], 2), tk, dtype, "cogvideox k", record_property)
