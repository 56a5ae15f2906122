"""ditfuse.patch on Wan-Animate-2 (WanAnimate2Transformer3DModel): the reference pass
(``kv_cache_mode="extract"``: normalised K / V cached before the rotation) and a denoising
pass against the cache (``"cached"``: the flex block mask over the generation tokens and
the rotated reference keys). Its RoPE (``rope_apply``) multiplies in complex fp64 per
sample's patch grid; ditfuse rotates in fp32 with the multipliers rounded to fp32: within
one rounding of the activation dtype, and the rotation tables are checked against
``rope_apply`` itself at real head dims, strided frames, several grids in a batch and
tokens past a grid (passed through)."""

from collections import Counter

import pytest
import torch

import ditfuse
from ditfuse.runtime import fastpath as _fastpath

diffusers = pytest.importorskip("diffusers")
ta = pytest.importorskip("diffusers.models.transformers.transformer_wan_animate_2")
from test_patch import _close  # noqa: E402

from ditfuse.patching import wan_animate2 as wa2  # noqa: E402
from ditfuse.tools.tiny_models import _randomize, to_dtype  # noqa: E402

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the tiny models run on the CPU through the interpreter"
)

LAYERS = 2


def _model(**kw):
    torch.manual_seed(0)
    cfg = dict(
        patch_size=(1, 2, 2),
        text_len=6,
        in_dim=8,
        dim=24,
        ffn_dim=32,
        freq_dim=16,
        text_dim=16,
        out_dim=4,
        num_heads=2,
        num_layers=LAYERS,
        cross_attn_norm=True,
        use_img_emb=True,
        refer_offset_w=-1,
        refer_stride=2,
    )
    return _randomize(ta.WanAnimate2Transformer3DModel(**{**cfg, **kw}))


def _inputs(dtype):
    """A reference segment of 2 latent frames on a 4 x 4 latent grid (patch grid 2 x 2 x 2:
    8 tokens) and a generation segment of 3 frames (the reference image's slot + 2), as the
    modular pipeline passes them; a 32 x 32 pixel area, 4 tokens a frame."""
    g = torch.Generator().manual_seed(1)

    def r(*s):
        return torch.randn(*s, generator=g).to(dtype)

    txt, clip = r(5, 16), r(1, 3, 1280)
    grid_ref = torch.tensor([[2, 2, 2]])
    extract = dict(
        hidden_states=[r(4, 2, 4, 4)],
        timestep=torch.tensor([900.0]),
        encoder_hidden_states=[txt],
        encoder_hidden_states_image=clip,
        condition_latents=[r(4, 2, 4, 4)],
        kv_cache_mode="extract",
        seq_len=8,
        offset_grid_sizes=grid_ref,
        return_dict=False,
    )
    cached = dict(
        hidden_states=[r(4, 3, 4, 4)],
        timestep=torch.tensor([500.0]),
        encoder_hidden_states=[txt],
        encoder_hidden_states_image=clip,
        condition_latents=[r(4, 3, 4, 4)],
        kv_cache_mode="cached",
        seq_len=12,
        reference_grid_sizes=grid_ref,
        origin_len=4,
        origin_area=[32, 32],
        return_dict=False,
    )
    return extract, cached


def _run(model, extract, cached):
    cache = ta.WanAnimate2KVCache(LAYERS)
    with torch.no_grad():
        model(kv_cache=cache, **extract)
        out = model(kv_cache=cache, **cached)[0][0]
    return out, cache


@pytest.mark.parametrize(
    "dtype",
    [pytest.param(torch.float32), torch.bfloat16],  # bf16: bitwise
    ids=["fp32", "bf16"],
)
@pytest.mark.slow  # a Wan variant: Wan T2V's whole model is in the default tier
def test_model_patched(dtype, monkeypatch):
    """Both passes patched against unpatched: the output and the cache contents within a few
    roundings, the kernels launched, unpatch exact."""
    model = to_dtype(_model(), dtype)
    extract, cached = _inputs(dtype)
    ref, ref_cache = _run(model, extract, cached)
    report = ditfuse.patch(model)
    assert report.counts.get("attention processors (QK-norm + RoPE)") == 2 * LAYERS, report.counts
    assert report.counts.get("blocks (AdaLN)") == LAYERS, report.counts
    kernels, real = Counter(), _fastpath.launch
    monkeypatch.setattr(_fastpath, "ENABLED", False)
    monkeypatch.setattr(
        _fastpath, "launch", lambda k, *a: (kernels.update([k.fn.__name__]), real(k, *a))[1]
    )
    out, cache = _run(model, extract, cached)
    assert any("qk" in k for k in kernels) and any("adaln" in k for k in kernels), kernels
    # bf16: not promised bitwise -- the norms' fp32 statistic is summed in another order than
    # torch's RMSNorm (one unit apart in ~1e-5 of the elements on the H200) and the RoPE is
    # fp32 against fp64 -- but nearly all elements agree
    share = _close(out, ref, dtype)
    for i in range(LAYERS):
        for got, want in (
            (cache.get(i).key, ref_cache.get(i).key),
            (cache.get(i).value, ref_cache.get(i).value),
        ):
            assert got.shape == want.shape and got.dtype == want.dtype
            s = _close(got, want, dtype)
            if dtype == torch.bfloat16:
                assert s > 0.99, (i, s)
    if dtype == torch.bfloat16:
        assert share > 0.99
    ditfuse.unpatch(model)
    again, _ = _run(model, extract, cached)
    assert torch.equal(again, ref)


def _rope_case(D, grids, S, stride, offsets=(0, 0, 0), rows=512):
    d = D
    freqs = torch.cat(
        [
            ta.rope_params(rows, d - 4 * (d // 6), offset=offsets[0]),
            ta.rope_params(rows, 2 * (d // 6), offset=offsets[1]),
            ta.rope_params(rows, 2 * (d // 6), offset=offsets[2]),
        ],
        dim=1,
    )
    return freqs, torch.tensor(grids)


ROPE_CASES = [
    # (head_dim, grids of the batch's samples, tokens a sample, frame stride)
    (128, [[3, 4, 5]], 60, 1),  # Wan 14B's head_dim, one sample, no padding
    (128, [[3, 4, 5], [2, 3, 3]], 64, 2),  # two grids, padded tokens, strided frames
    (80, [[2, 3, 7], [2, 3, 7]], 45, 1),  # D = 80: splits 14 / 13 / 13; the same grid twice
    (12, [[5, 1, 2]], 11, 3),  # tiny head, one padded token
]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("D,grids,S,stride", ROPE_CASES)
def test_rotation_is_rope_apply(D, grids, S, stride, dtype):
    """The kernel's rotation with :func:`_tables` against ``rope_apply`` (fp64) on the same
    normalised rows, every element: fp32 within 2 ulp-scale of the value, bf16 at most one
    unit in the last place apart and almost all equal; tokens past a grid unchanged."""
    freqs, grid_sizes = _rope_case(D, grids, S, stride, offsets=(1, 0, 3))
    H = 3
    x = torch.randn(len(grids), S, H, D, dtype=torch.float64).to(dtype)
    want = ta.rope_apply(x, grid_sizes, freqs, stride).type_as(x)
    grid = wa2._grid_list(grid_sizes)
    assert wa2._tables_ok(freqs, grid, stride, S, D)
    cos, sin = wa2._tables(freqs, grid, stride, S)
    assert cos.dim() == (2 if len(set(map(tuple, grids))) == 1 else 3)
    got = wa2._rotate(x, cos, sin, H)
    flat, _ = ditfuse.qk_norm_rope(x.flatten(2), None, cos, sin, num_heads=H, rotary_dim=D)
    assert torch.equal(flat.unflatten(2, (H, D)), got)  # (B, S, H*D) as the processor calls it
    for i, (f, h, w) in enumerate(grids):
        assert torch.equal(got[i, f * h * w :], x[i, f * h * w :])
    err = (got.double() - want.double()).abs()
    if dtype == torch.float32:
        # fp32 products of fp32-rounded multipliers: a few fp32 roundings of the pair's size
        pair = (x[..., 0::2].double().abs() + x[..., 1::2].double().abs()).repeat_interleave(2, -1)
        assert (err <= 3 * torch.finfo(torch.float32).eps * pair).all(), (err / pair).max()
    else:
        # one bf16 rounding of the result plus the fp32 arithmetic's error (a few fp32
        # roundings of the pair's size: where the rotation cancels, many bf16 units of the
        # tiny result; H200, Wan 14B's shape, 2026-12-02: docs/design/qk_norm_rope.md)
        mag = want.double().abs().clamp_min(2.0**-126)
        ulp = torch.finfo(torch.bfloat16).eps * torch.exp2(torch.floor(torch.log2(mag)))
        pair = (x[..., 0::2].double().abs() + x[..., 1::2].double().abs()).repeat_interleave(2, -1)
        bound = ulp + 3 * torch.finfo(torch.float32).eps * pair
        assert (err <= bound).all(), (err / bound).max()
        assert (got == want).double().mean() > 0.99


def test_tables_out_of_range_fall_back():
    """A grid the table does not cover (more strided frames than rows) is not taken: the
    processor runs ``rope_apply`` (which raises as it would unpatched)."""
    freqs, _ = _rope_case(12, [[1, 1, 1]], 1, 1, rows=8)
    assert wa2._tables_ok(freqs, [(4, 2, 2)], 2, 16, 12)
    assert not wa2._tables_ok(freqs, [(5, 2, 2)], 2, 20, 12)  # frame 4 * stride 2 = row 8
    assert not wa2._tables_ok(freqs, [(2, 9, 1)], 1, 18, 12)  # row 9 of 8
    assert not wa2._tables_ok(freqs, [(2, 2, 2)], 1, 7, 12)  # 8 cells in 7 tokens
    assert not wa2._tables_ok(freqs, [(2, 2, 2)], 1, 8, 16)  # head_dim 16 vs 6 columns
    assert not wa2._tables_ok(freqs.real, [(2, 2, 2)], 1, 8, 12)  # not the complex table


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@torch.no_grad()
def test_extract_processor_batch_of_grids(dtype):
    """The reference pass's processor on a batch of two samples with different grids (the
    second padded) and strided frames, as the processor allows (the model's forward passes
    one grid): the cached K / V as the base processor's (within a rounding; nearly all
    bf16 elements equal), the output within a few roundings."""
    torch.manual_seed(3)
    H, D = 2, 12
    attn = to_dtype(ta.WanAnimate2Attention(dim=H * D, heads=H), dtype).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    freqs, grid_sizes = _rope_case(D, [[3, 2, 2], [2, 2, 2]], 12, 2)
    x = torch.randn(2, 12, H * D).to(dtype)
    kw = dict(rotary_emb=freqs, grid_sizes=grid_sizes, kv_cache_mode="extract", rope_stride=2)
    base, fused = ta.WanAnimate2KVLayerCache(), ta.WanAnimate2KVLayerCache()
    want = ta.WanAnimate2AttnProcessor()(attn, x, kv_cache=base, **kw)
    proc = wa2._make_processors()[ta.WanAnimate2AttnProcessor]()
    got = proc(attn, x, kv_cache=fused, **kw)
    _close(got, want, dtype)
    for a, b in ((fused.key, base.key), (fused.value, base.value)):
        assert a.shape == b.shape == (2, 12, H, D)
        s = _close(a, b, dtype)
        if dtype == torch.bfloat16:
            assert s > 0.99


class _Halve(torch.nn.Module):
    def forward(self, x):
        return x * 0.5


@torch.no_grad()
def test_processor_norms():
    """A LayerNorm in place of the RMSNorm is read by the kernel (fused, within a rounding);
    a norm it does not read: the base processor's code runs, the same bits."""
    torch.manual_seed(4)
    H, D = 2, 12
    attn = ta.WanAnimate2Attention(dim=H * D, heads=H).eval()
    freqs, grid_sizes = _rope_case(D, [[2, 2, 2]], 8, 1)
    x = torch.randn(1, 8, H * D)
    kw = dict(rotary_emb=freqs, grid_sizes=grid_sizes, kv_cache_mode="extract")
    proc = wa2._make_processors()[ta.WanAnimate2AttnProcessor]()
    for norm, bitwise in ((torch.nn.LayerNorm(H * D), False), (_Halve(), True)):
        attn.norm_q = norm
        want = ta.WanAnimate2AttnProcessor()(attn, x, kv_cache=ta.WanAnimate2KVLayerCache(), **kw)
        got = proc(attn, x, kv_cache=ta.WanAnimate2KVLayerCache(), **kw)
        assert (
            torch.equal(got, want) if bitwise else torch.allclose(got, want, rtol=1e-5, atol=1e-5)
        )


def test_bf16_cast_model_blocks_fall_back():
    """A model cast whole (``.to(bfloat16)``: the modulation table in bf16, added to the temb
    in bf16 by the block) keeps its blocks' own forwards; the processors are still fused."""
    model = _model().to(torch.bfloat16)
    report = ditfuse.patch(model)
    assert report.counts.get("blocks (AdaLN)") is None, report.counts
    assert report.counts.get("attention processors (QK-norm + RoPE)") == 2 * LAYERS


@pytest.mark.slow
def test_compile_repeated_blocks_patched():
    """The patched blocks under ``compile_repeated_blocks`` (how the model's cached pass is
    meant to run: its flex attention compiled; not fullgraph -- the processors read the grid
    from a tensor, unpatched too) give the eager patched output."""
    model = _model()
    extract, cached = _inputs(torch.float32)
    ditfuse.patch(model)
    want, want_cache = _run(model, extract, cached)
    torch._dynamo.reset()
    try:
        model.compile_repeated_blocks(backend="aot_eager")
        got, cache = _run(model, extract, cached)
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for i in range(LAYERS):
        torch.testing.assert_close(cache.get(i).key, want_cache.get(i).key, rtol=1e-5, atol=1e-5)


def test_tables_once_a_step_one_slot():
    """The tables are built once for the blocks of a step (the same objects come back for the
    same freqs and grid) and a new grid replaces them: one cached set a freqs table."""
    from ditfuse.patching.common import _TABLES

    freqs, _ = _rope_case(12, [[1, 1, 1]], 1, 1, rows=16)
    a = wa2._rope_tables(freqs, [(2, 2, 2)], 1, 8)
    assert wa2._rope_tables(freqs, [(2, 2, 2)], 1, 8) is a
    b = wa2._rope_tables(freqs, [(3, 2, 2)], 1, 12)
    assert b is not a and b[0].shape == (12, 6)
    assert wa2._rope_tables(freqs, [(3, 2, 2)], 1, 12) is b
    assert sum(1 for ref, _, _ in _TABLES.values() if ref() is freqs) == 1
    freqs.mul_(1.0)  # modified in place: rebuilt
    assert wa2._rope_tables(freqs, [(3, 2, 2)], 1, 12) is not b
