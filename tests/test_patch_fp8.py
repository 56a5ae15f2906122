"""ditfuse.patch(..., attention="fp8"): the DiT attention processors on 8-bit attention (Q / K
int8 with per-token scales from the QK-norm + RoPE kernel, ``ditfuse.attention(...,
precision="fp8")``). Tiny models at head_dim 64, bf16: the 8-bit path really runs (a spy on
the attention op's ``run``), the output close to the unpatched model's -- key-padding masks
that drop keys included (the kernel's ``key_mask``) --, every case the kernel does not take
(another mask that masks something, head_dim, fp32, classes without an 8-bit path) the exact
16-bit path, unpatch restores the original bits, bad values rejected."""

import pytest
import torch

import ditfuse

diffusers = pytest.importorskip("diffusers")
from ditfuse.ops import attention_fp8 as _attention_fp8  # noqa: E402
from ditfuse.tolerances import ATTENTION_8BIT_COS_MIN, ATTENTION_8BIT_REL_L2_MAX  # noqa: E402
from ditfuse.tools.tiny_models import CASES, FP8_CASES, _qwen, _qwen_inputs, to_dtype  # noqa: E402

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="the tiny models run on the "
    "CPU, where the 8-bit kernel runs through Triton's interpreter",
)

# A whole (tiny) model's output with 8-bit attention against the unpatched bf16 model: Q K^T
# in int8 (per-token scales), P and V in e4m3 (3 mantissa bits) in every attention of the
# model. Measured 0.99980 .. 0.99998 and 0.006 .. 0.021 (docs/patching.md, "8-bit attention").
COS_MIN, REL_L2_MAX = ATTENTION_8BIT_COS_MIN, ATTENTION_8BIT_REL_L2_MAX

_FP8_LABEL = "attention processors (QK-norm + RoPE, 8-bit attention)"
_FP8 = {c[0]: c for c in FP8_CASES}
_CASES = {c[0]: c for c in CASES}
#: Wan I2V needs 512 prompt tokens for non-empty image keys; FLUX.1 shares FLUX.2's 8-bit
#: route and its exact patch is in the default tier (test_patch.py): the slow tier
_SLOW = ("wan-i2v", "flux1")


def _spy(monkeypatch):
    """Record the 8-bit attention launches (``ditfuse.ops.attention_fp8.run``: the kernel, or
    its emulation, of every 8-bit call, eager or through the torch.library op): Q's shape and
    whether a key mask came with it."""
    calls = []
    real = _attention_fp8.run

    def run(p):
        calls.append((tuple(p.q.shape), p.key_mask is not None))
        return real(p)

    monkeypatch.setattr(_attention_fp8, "run", run)
    return calls


def _accuracy(out, ref):
    o, r = out.float().flatten(), ref.float().flatten()
    cos = torch.nn.functional.cosine_similarity(o, r, dim=0).item()
    rel = ((o - r).norm() / r.norm()).item()
    return cos, rel


def _originals(model):
    for m in model.modules():
        if hasattr(m, "processor"):
            assert not getattr(m.processor, "_ditfuse", False), type(m.processor)
        assert "forward" not in m.__dict__


def _fp8_params():
    return [
        pytest.param(*c, id=c[0], marks=pytest.mark.slow if c[0] in _SLOW else ())
        for c in FP8_CASES
    ]


@pytest.mark.parametrize("name,make,inputs,calls", _fp8_params())
@torch.no_grad()
def test_fp8_close_to_unpatched(name, make, inputs, calls, monkeypatch):
    model = to_dtype(make(), torch.bfloat16)
    kw = inputs(torch.bfloat16)
    ref = model(**kw)[0]
    report = ditfuse.patch(model, attention="fp8")
    labels = [k for k in report.counts if "8-bit attention" in k]
    assert labels, report.counts
    n_procs = sum(report.counts[k] for k in labels)
    seen = _spy(monkeypatch)
    out = model(**kw)[0]
    assert len(seen) == calls, f"{len(seen)} 8-bit attention calls, {calls} wanted"
    monkeypatch.undo()
    cos, rel = _accuracy(out, ref)
    print(f"{name}: cosine {cos:.6f}, relative L2 {rel:.4f} ({len(seen)} 8-bit calls)")
    assert torch.isfinite(out).all()
    assert cos >= COS_MIN and rel <= REL_L2_MAX, (cos, rel)
    assert ditfuse.unpatch(model) == n_procs + sum(
        v for k, v in report.counts.items() if k not in labels
    )
    assert torch.equal(model(**kw)[0], ref), "unpatch must restore the original outputs exactly"
    _originals(model)


def _gpu_route(monkeypatch):
    """The sm_90 route on the CPU: ``common.qk_8bit`` as on a GPU (16-bit Q / K), the front
    door taking 16-bit calls without a window to ``attention_fp8.run_ws``, which is replaced
    by exact SDPA (with the key mask, if any) in V's dtype recording Q / K's dtypes -- so a
    patched model's output shows whether the processors hand the warp-specialized kernel the
    right normalised, rotated Q / K in the right layout, and the right key mask."""
    from torch.nn import functional as F

    from ditfuse.ops import attention_api
    from ditfuse.patching import common
    from ditfuse.reference import attention_out_rows8

    ws = []

    def run_ws(q, k, v, scale, layout, key_mask=None, q_scale=None, rows8=False):
        assert q_scale is None, "the processors hand the kernel 16-bit Q on a GPU"
        ws.append((q.dtype, k.dtype, tuple(q.shape), layout, key_mask is not None, rows8))
        t = (lambda x: x.transpose(1, 2)) if layout == "bshd" else (lambda x: x)
        m = None if key_mask is None else key_mask[:, None, None, :]
        o = F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=m, scale=scale)
        o = t(o).to(v.dtype).contiguous()
        return attention_out_rows8(o, v, key_mask) if rows8 else o

    monkeypatch.setattr(common, "qk_8bit", lambda key_mask=None: None)
    monkeypatch.setattr(attention_api, "_ws_ok", lambda q, k, window: window is None)
    monkeypatch.setattr(_attention_fp8, "run_ws", run_ws)
    return ws


@pytest.mark.parametrize(
    "name,make,inputs,calls",
    [  # the default tier: one model a route (Wan unmasked, Qwen-Image key-padded)
        pytest.param(
            *c, id=c[0], marks=() if c[0] in ("wan-t2v", "qwen-image") else pytest.mark.slow
        )
        for c in FP8_CASES
    ],
)
@torch.no_grad()
def test_fp8_gpu_route_hands_16bit_qk(name, make, inputs, calls, monkeypatch):
    """On an sm_90 GPU a patched processor's 8-bit call hands the front door the QK kernel's
    16-bit Q / K (the warp-specialized kernel quantizes them itself), a key-padded call with
    its key mask. With the warp-specialized kernel stood in for by exact SDPA, the model
    computes bitwise what ``patch(attention=True)`` does."""

    model = to_dtype(make(), torch.bfloat16)
    kw = inputs(torch.bfloat16)
    ditfuse.patch(model)
    exact = model(**kw)[0]
    ditfuse.unpatch(model)
    ditfuse.patch(model, attention="fp8")
    ws = _gpu_route(monkeypatch)
    per_token = _spy(monkeypatch)
    out = model(**kw)[0]
    monkeypatch.undo()
    assert len(ws) == calls and not per_token, (ws, per_token)
    assert all(q == k == torch.bfloat16 for q, k, *_ in ws), ws
    assert torch.equal(out, exact), _accuracy(out, exact)


@pytest.mark.parametrize("name", ["qwen-image", pytest.param("wan-t2v", marks=pytest.mark.slow)])
@torch.no_grad()
def test_fp8_short_calls_take_the_16bit_path_on_a_gpu(name, monkeypatch):
    """On a GPU a call of fewer keys than ``common.EIGHT_BIT_MIN_KEYS`` attends exactly (the
    8-bit route measured slower than cuDNN there): the tiny models' calls, with the device
    taken for a GPU, give bitwise what ``patch(attention=True)`` does and launch no 8-bit
    kernel; with ``eight_bit_min_keys(0)`` every call is 8-bit again."""
    from ditfuse.patching import common

    _, make, inputs, calls = _FP8[name]
    model = to_dtype(make(), torch.bfloat16)
    kw = inputs(torch.bfloat16)
    ditfuse.patch(model)
    exact = model(**kw)[0]
    ditfuse.unpatch(model)
    ditfuse.patch(model, attention="fp8")
    enough = common.enough_keys_8bit
    monkeypatch.setattr(common, "enough_keys_8bit", lambda n, on_gpu: enough(n, True))
    ws = _gpu_route(monkeypatch)
    per_token = _spy(monkeypatch)
    out = model(**kw)[0]
    assert not ws and not per_token, (ws, per_token)
    assert torch.equal(out, exact)
    with common.eight_bit_min_keys(0):
        model(**kw)
    assert len(ws) == calls and not per_token, (ws, per_token)
    assert common.min_keys_8bit() == common.EIGHT_BIT_MIN_KEYS


@pytest.mark.parametrize("bad", [-1, 1.5, True, "4096"])
def test_eight_bit_min_keys_rejects_bad_counts(bad):
    from ditfuse.patching import common

    with pytest.raises(ValueError, match="n must be an int >= 0"):
        with common.eight_bit_min_keys(bad):
            pass
    assert common.min_keys_8bit() == common.EIGHT_BIT_MIN_KEYS


#: the inputs given a second batch entry of their own (the rest repeated)
_FRESH = (
    "hidden_states",
    "encoder_hidden_states",
    "pooled_projections",
    "image_embeds",
    "latents_clean",
    "latents_history_2x",
    "latents_history_4x",
)


def _batch2(kw):
    """``kw`` at batch 2: the second entry's activations fresh random, every other batched
    input (first dim 1: timestep, guidance, masks, FLUX.2's ids; not FramePack's frame
    indices) repeated."""
    g = torch.Generator().manual_seed(23)
    out = dict(kw)
    for k, v in kw.items():
        if (
            isinstance(v, torch.Tensor)
            and v.dim()
            and v.shape[0] == 1
            and not k.startswith("indices_")
        ):
            second = torch.randn(v.shape, generator=g).to(v.dtype) if k in _FRESH else v
            out[k] = torch.cat([v, second])
    if "img_shapes" in kw:  # Qwen-Image: one entry a batch entry
        out["img_shapes"] = kw["img_shapes"] * 2
    return out


def _key_padded(name, kw):
    """Batch-2 inputs of ``name`` whose attention sees a key-padding mask that drops keys --
    bool (B or 1, 1, 1, N) in the joint token order -- and the same inputs with no key
    dropped; the batch entries it drops keys of. HunyuanVideo and Qwen-Image build the mask
    from the prompt mask (the second prompt padded); FLUX.1 / FLUX.2 get it through
    ``joint_attention_kwargs``: FLUX.1 one (B, 1, 1, N) mask, two text and five image keys
    of the first entry dropped and every key of the second (a batch entry with nothing to
    attend: SDPA writes zeros on the CPU, as the kernel does); FLUX.2 one (1, 1, 1, N) row
    for both entries."""
    kw = _batch2(kw)
    free = dict(kw)
    if name == "hunyuan-video":
        m = kw["encoder_attention_mask"].clone()
        m[1, -2:] = 0
        kw["encoder_attention_mask"] = m
        return kw, free, (1,)
    if name == "qwen-image":
        m = kw["encoder_hidden_states_mask"].clone()
        m[1, -3:] = False
        kw["encoder_hidden_states_mask"] = m
        return kw, free, (1,)
    T = kw["encoder_hidden_states"].shape[1]
    n = kw["hidden_states"].shape[1] + T
    if name == "flux1":
        m = torch.ones(2, 1, 1, n, dtype=torch.bool)
        m[0, ..., [1, 4, T + 2, T + 5, T + 8, T + 11, T + 14]] = False
        m[1] = False
    else:
        m = torch.ones(1, 1, 1, n, dtype=torch.bool)
        m[..., [T - 1, T + 4, T + 9]] = False
    kw["joint_attention_kwargs"] = {"attention_mask": m}
    return kw, free, (0, 1)


_KEY_PADDED = [
    pytest.param(n, marks=pytest.mark.slow if n != "qwen-image" else ())
    for n in ("hunyuan-video", "qwen-image", "flux1", "flux2")
]


@pytest.mark.parametrize("name", _KEY_PADDED)
@torch.no_grad()
def test_fp8_key_padding_mask(name, monkeypatch):
    """A key-padding mask that drops keys: the 8-bit path (the kernel's ``key_mask``), every
    batch entry close to the unpatched masked model -- less than half as far as the
    unpatched model without the mask is (the dropped keys really dropped); an entry with every key
    dropped: finite, bitwise the unpatched model's (zeros from both attentions)."""
    _, make, inputs, calls = _FP8[name]
    model = to_dtype(make(), torch.bfloat16)
    kw, free, dropped = _key_padded(name, inputs(torch.bfloat16))
    ref = model(**kw)[0]
    unmasked = model(**free)[0]
    assert torch.isfinite(ref).all()  # the CPU's SDPA: zeros for a row with no key
    ditfuse.patch(model, attention="fp8")
    seen = _spy(monkeypatch)
    out = model(**kw)[0]
    assert len(seen) == calls, f"{len(seen)} 8-bit attention calls, {calls} wanted"
    assert all(masked for _, masked in seen), seen
    assert torch.isfinite(out).all()
    for b in range(2):
        cos, rel = _accuracy(out[b], ref[b])
        print(
            f"{name} entry {b}: cosine {cos:.6f}, relative L2 {rel:.4f}"
            + (f" (unmasked model {_accuracy(unmasked[b], ref[b])[1]:.4f})" if b in dropped else "")
        )
        assert cos >= COS_MIN and rel <= REL_L2_MAX, (b, cos, rel)
        if b in dropped:
            assert rel < _accuracy(unmasked[b], ref[b])[1] / 2, (b, rel)
    if name == "flux1":  # its second entry drops every key
        assert torch.equal(out[1], ref[1])


def _call(name, model, kw, dtype):
    """(``name``'s call with a mask that is no key-padding mask, the same call without it, its
    8-bit launches): a query x key mask (the outer product of a token mask, as Chroma builds
    it; Wan's per-query form of a dropped key) or an additive bias (FLUX.2 through
    ``joint_attention_kwargs``, Qwen-Image's joint mask from a float prompt mask: the
    processor concatenates it with its boolean image mask into a float bias); FLUX.2's
    unmasked call passes an all-zero bias, which is dropped."""
    g = torch.Generator().manual_seed(11)
    if name in ("flux1", "flux2"):
        n = kw["hidden_states"].shape[1] + kw["encoder_hidden_states"].shape[1]
        if name == "flux1":
            t = torch.ones(n, dtype=torch.bool)
            t[[2, n - 3]] = False
            m, none = (t[None, None, None, :] * t[None, None, :, None]), None
        else:
            none = torch.zeros(1, 1, 1, n, dtype=dtype)
            m = none.clone()
            m[..., [1, n - 4]] = float("-inf")
            m[..., 5] = -0.5
        return (
            lambda masked: model(
                **kw, joint_attention_kwargs={"attention_mask": m if masked else none}
            )[0]
        ), _FP8[name][3]
    if name.startswith("wan"):
        attn = model.blocks[0].attn1
        x = torch.randn(1, 16, attn.inner_dim, generator=g).to(dtype)
        m = torch.ones(1, 1, 16, 16, dtype=torch.bool)
        m[..., 3] = False
        return (lambda masked: attn(x, None, m if masked else None, None)), 1
    attn = model.transformer_blocks[0].attn
    x = torch.randn(1, 16, attn.inner_dim, generator=g).to(dtype)
    T = 5 if name == "hunyuan-video" else 7
    e = torch.randn(1, T, attn.inner_dim, generator=g).to(dtype)
    if name == "hunyuan-video":
        t = torch.ones(16 + T, dtype=torch.bool)
        t[-2:] = False
        m = t[None, None, None, :] * t[None, None, :, None]
        return (lambda masked: attn(x, e, m if masked else None)), 1
    m = torch.ones(1, T, dtype=dtype)
    m[:, -3:] = 0
    return (lambda masked: attn(x, e, encoder_hidden_states_mask=m if masked else None)), 1


@pytest.mark.parametrize(
    "name",
    [  # FLUX.1 / FLUX.2 / HunyuanVideo: tens of seconds in the interpreter
        pytest.param(
            c[0],
            marks=pytest.mark.slow if c[0] in _SLOW + ("flux1", "flux2", "hunyuan-video") else (),
        )
        for c in FP8_CASES
    ],
)
@torch.no_grad()
def test_fp8_other_masks_take_the_16bit_path(name, monkeypatch):
    """A mask that is no key-padding mask and masks something: the exact 16-bit path of
    ``patch(attention=True)`` (bitwise), no 8-bit launch; the same call without it (or with
    an all-zero bias, dropped): 8-bit."""
    _, make, inputs, _ = _FP8[name]
    model = to_dtype(make(), torch.bfloat16)
    call, calls = _call(name, model, inputs(torch.bfloat16), torch.bfloat16)
    ditfuse.patch(model)
    want = call(True)
    ditfuse.unpatch(model)
    ditfuse.patch(model, attention="fp8")
    seen = _spy(monkeypatch)
    got = call(True)
    assert not seen, f"a masked call took the 8-bit path: {seen}"
    for g, w in zip(
        got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)
    ):
        assert torch.equal(g, w), "the masked call must be the exact 16-bit path"
    call(False)
    assert len(seen) == calls, seen


@pytest.mark.parametrize(
    "name,why",
    [
        ("qwen-image", "head_dim"),
        ("qwen-image", "fp32"),
        pytest.param("hunyuan-video", "head_dim", marks=pytest.mark.slow),
        pytest.param("flux1", "fp32", marks=pytest.mark.slow),
        pytest.param("wan-t2v", "fp32", marks=pytest.mark.slow),
    ],
)
@torch.no_grad()
def test_fp8_unsupported_calls_take_the_16bit_path(name, why, monkeypatch):
    """head_dim 16 (the default tiny configs) and fp32 models: no 8-bit launch, bitwise the
    output of ``patch(attention=True)``; the report names the exact attention and why."""
    if why == "head_dim":
        make, inputs, dtype = _CASES[name][1], _CASES[name][2], torch.bfloat16
    else:
        make, inputs, dtype = _FP8[name][1], _FP8[name][2], torch.float32
    model = to_dtype(make(), dtype)
    kw = inputs(dtype)
    ditfuse.patch(model)
    want = model(**kw)[0]
    ditfuse.unpatch(model)
    report = ditfuse.patch(model, attention="fp8")
    hds = {
        m.to_q.out_features // m.heads
        for m in model.modules()
        if hasattr(m, "heads") and hasattr(getattr(m, "to_q", None), "out_features")
    }
    reason = {
        "head_dim": [
            f"exact attention: head_dim {hd}, the 8-bit kernel takes 64 or 128"
            for hd in sorted(hds)
        ][0],
        "fp32": "exact attention: float32 model",
    }[why]
    assert not any("8-bit attention" in k for k in report.counts), report.counts
    assert any(reason in k for k in report.counts), report.counts
    seen = _spy(monkeypatch)
    got = model(**kw)[0]
    assert not seen, f"{why}: the 8-bit path ran {seen}"
    assert torch.equal(got, want)


def test_fp8_report_names_the_attention_run(monkeypatch):
    """The report names the attention each processor will run: 8-bit (with the mask rule),
    or exact and why -- head_dim 32, an fp32 model, a device the kernel does not run on (the
    CPU without Triton's interpreter) -- never "8-bit attention" for those."""
    from ditfuse.runtime import backend

    class Report:
        def __init__(self, model):
            report = ditfuse.patch(model, attention="fp8")
            ditfuse.unpatch(model)
            self.text = str(report)
            self.counts = {
                k: v for k, v in report.counts.items() if k.startswith("attention processors")
            }

        def __str__(self):
            return self.text

    labels = Report

    r = labels(to_dtype(_qwen(head_dim=64), torch.bfloat16))
    assert r.counts == {_FP8_LABEL: 1}, r.counts
    assert "key-padding mask" in str(r), str(r)
    assert "on a GPU those of >= 12288 keys" in str(r), str(r)
    from ditfuse.patching import common

    with common.eight_bit_min_keys(4096):
        assert "on a GPU those of >= 4096 keys" in str(labels(to_dtype(_qwen(64), torch.bfloat16)))
    r = labels(to_dtype(_qwen(head_dim=32), torch.bfloat16))
    assert r.counts == {
        "attention processors (QK-norm + RoPE, exact attention: head_dim 32, "
        "the 8-bit kernel takes 64 or 128)": 1
    }, r.counts
    assert "8-bit" not in str(r).replace("8-bit kernel", ""), str(r)
    r = labels(to_dtype(_qwen(head_dim=64), torch.float32))
    assert list(r.counts) == [
        "attention processors (QK-norm + RoPE, exact attention: float32 "
        "model, the 8-bit path takes float16 / bfloat16)"
    ], r.counts
    monkeypatch.setattr(backend, "INTERPRET", False)
    r = labels(to_dtype(_qwen(head_dim=64), torch.bfloat16))
    assert list(r.counts) == [
        "attention processors (QK-norm + RoPE, exact attention: on cpu, "
        "the 8-bit kernel runs on an sm_90 GPU or the CPU under Triton's "
        "interpreter)"
    ], r.counts


@torch.no_grad()
def test_fp8_switch_and_back(monkeypatch):
    """Patching again with another ``attention`` switches the processors' precision (counted
    in the report); unpatch restores the original processors whichever was last."""
    model = to_dtype(_qwen(head_dim=64), torch.bfloat16)
    kw = _qwen_inputs(torch.bfloat16)
    ref = model(**kw)[0]
    ditfuse.patch(model)
    out16 = model(**kw)[0]
    report = ditfuse.patch(model, attention="fp8")
    assert report.counts == {_FP8_LABEL: 1}, report.counts
    assert not ditfuse.patch(model, attention="fp8").counts, "the same patch twice: nothing new"
    seen = _spy(monkeypatch)
    out8 = model(**kw)[0]
    assert len(seen) == 1 and not torch.equal(out8, out16)
    report = ditfuse.patch(model, attention=True)
    assert report.counts == {"attention processors (QK-norm + RoPE)": 1}, report.counts
    assert torch.equal(model(**kw)[0], out16) and len(seen) == 1
    ditfuse.patch(model, attention="fp8")
    assert ditfuse.unpatch(model) == 2  # the processor and the block
    assert torch.equal(model(**kw)[0], ref)
    _originals(model)


@torch.no_grad()
def test_fp8_class_without_8bit_path(monkeypatch):
    """A class with no 8-bit path (the SA3 DiT): patched as with ``attention=True`` (bitwise
    its output), and the report says its attention stays 16-bit."""
    name, make, inputs, _ = _CASES["sa3-dit"]
    model = to_dtype(make(), torch.bfloat16)
    kw = inputs(torch.bfloat16)
    ditfuse.patch(model)
    want = model(**kw)[0]
    ditfuse.unpatch(model)
    report = ditfuse.patch(model, attention="fp8")
    assert "no 8-bit path" in str(report), str(report)
    seen = _spy(monkeypatch)
    assert torch.equal(model(**kw)[0], want) and not seen


@pytest.mark.parametrize("bad", ["bogus", "FP8", "int8", 1, 0, None, 1.0])
def test_attention_value_rejected(bad):
    model = _qwen()
    with pytest.raises(ValueError, match="attention"):
        ditfuse.patch(model, attention=bad)
    _originals(model)  # rejected before anything was replaced


def test_fp8_needs_the_qk_processors():
    model = _qwen()
    with pytest.raises(ValueError, match="qk_norm_rope"):
        ditfuse.patch(model, attention="fp8", qk_norm_rope=False)
    _originals(model)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,mask",
    [
        ("flux1", None),
        ("flux2", None),
        ("wan-t2v", None),
        ("qwen-image", None),
        ("hunyuan-video", None),
        ("hunyuan-video", "key-padding"),
        ("qwen-image", "key-padding"),
        ("flux2", "key-padding"),
        ("flux2", "query-key, all True"),
        ("flux2", "query-key"),
    ],
)
@torch.no_grad()
def test_fp8_compile_fullgraph(name, mask, monkeypatch):
    """The 8-bit processors trace whole (torch.compile fullgraph=True: the prologue and the
    attention are torch.library ops): the eager output. A key-padding mask goes to the kernel
    in the graph, no branch -- HunyuanVideo's and Qwen-Image's joint masks always (all True
    for the tiny inputs), and masks that drop keys (``_key_padded``); another mask is a
    ``torch.cond`` on whether it masks anything -- FLUX.2 with a query x key mask: all True,
    8-bit; masking, the 16-bit path of ``patch(attention=True)``."""
    _, make, inputs, calls = _FP8[name]
    model = to_dtype(make(), torch.bfloat16)
    kw = inputs(torch.bfloat16)
    if mask == "key-padding":
        kw = _key_padded(name, kw)[0]
    elif mask is not None:
        n = kw["hidden_states"].shape[1] + kw["encoder_hidden_states"].shape[1]
        t = torch.ones(n, dtype=torch.bool)
        if mask == "query-key":
            t[[1, n - 2]] = False
            calls = 0
        kw["joint_attention_kwargs"] = {
            "attention_mask": t[None, None, None, :] * t[None, None, :, None]
        }
    ditfuse.patch(model, attention="fp8")
    want = model(**kw)[0]
    torch._dynamo.reset()
    seen = _spy(monkeypatch)
    try:
        got = torch.compile(model, fullgraph=True, backend="aot_eager")(**kw)[0]
    finally:
        torch._dynamo.reset()
    assert len(seen) == calls, seen
    keyed = mask == "key-padding" or name in ("hunyuan-video", "qwen-image")
    assert all(masked == keyed for _, masked in seen), seen
    torch.testing.assert_close(got, want, rtol=2.0**-6, atol=2.0**-6 * want.abs().max().item())


# ---------------------------------------------------------------------------------------
# The variants whose processors are their own code or reach the 8-bit path another way, at
# head_dim 64 (slow tier): Chroma (FLUX.1's processor under a text mask), HunyuanVideo
# FramePack (HunyuanVideo's processor) and 1.5 (its own processor, the joint mask built
# inside), Wan-Animate-2 ("extract": its self-attention and cross-attention on 8 bits;
# "cached": its flex block-mask self-attention 16-bit, the cross-attention 8-bit).


def _variant(name):
    from diffusers import (
        ChromaTransformer2DModel,
        HunyuanVideo15Transformer3DModel,
        HunyuanVideoFramepackTransformer3DModel,
    )

    from ditfuse.tools.tiny_models import _randomize

    g = torch.Generator().manual_seed(31)

    def r(*s):
        return torch.randn(*s, generator=g).to(torch.bfloat16)

    if name == "chroma":
        model = ChromaTransformer2DModel(
            patch_size=1,
            in_channels=4,
            num_layers=1,
            num_single_layers=2,
            attention_head_dim=64,
            num_attention_heads=2,
            joint_attention_dim=32,
            axes_dims_rope=(16, 24, 24),
            approximator_num_channels=8,
            approximator_hidden_dim=16,
            approximator_layers=1,
        )
        S, T = 9, 5
        kw = dict(
            hidden_states=r(2, S, 4),
            encoder_hidden_states=r(2, T, 32),
            timestep=torch.tensor([0.5, 0.2]).to(torch.bfloat16),
            img_ids=torch.randn(S, 3, generator=g),
            txt_ids=torch.randn(T, 3, generator=g),
            attention_mask=torch.ones(2, S + T, dtype=torch.bool),
            return_dict=False,
        )
        return _randomize(model), kw, "attention_mask", 3
    if name == "framepack":
        model = HunyuanVideoFramepackTransformer3DModel(
            in_channels=4,
            out_channels=4,
            num_attention_heads=2,
            attention_head_dim=64,
            num_layers=1,
            num_single_layers=1,
            num_refiner_layers=1,
            patch_size=2,
            patch_size_t=1,
            guidance_embeds=True,
            text_embed_dim=16,
            pooled_projection_dim=8,
            rope_axes_dim=(16, 24, 24),
            image_condition_type=None,
            has_image_proj=True,
            image_proj_dim=8,
            has_clean_x_embedder=True,
        )
        F, H, W = 2, 4, 4
        kw = dict(
            hidden_states=r(1, 4, F, H, W),
            timestep=torch.tensor([3.0]).to(torch.bfloat16),
            encoder_hidden_states=r(1, 5, 16),
            encoder_attention_mask=torch.ones(1, 5).to(torch.bfloat16),
            pooled_projections=r(1, 8),
            image_embeds=r(1, 3, 8),
            indices_latents=torch.arange(F) + 7,
            latents_clean=r(1, 4, 1, H, W),
            indices_latents_clean=torch.tensor([0]),
            latents_history_2x=r(1, 4, 2, H, W),
            indices_latents_history_2x=torch.tensor([1, 2]),
            latents_history_4x=r(1, 4, 4, H, W),
            indices_latents_history_4x=torch.tensor([3, 4, 5, 6]),
            guidance=torch.tensor([5.0]).to(torch.bfloat16),
            return_dict=False,
        )
        return _randomize(model), kw, "encoder_attention_mask", 2
    model = HunyuanVideo15Transformer3DModel(
        in_channels=9,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=64,
        num_layers=2,
        num_refiner_layers=1,
        mlp_ratio=2.0,
        patch_size=1,
        patch_size_t=1,
        text_embed_dim=16,
        text_embed_2_dim=8,
        image_embed_dim=8,
        rope_axes_dim=(16, 24, 24),
        target_size=16,
        task_type="i2v",
    )
    kw = dict(  # 2 frames of 2 x 3 latents: the interpreter's cost grows with the tokens
        hidden_states=r(2, 9, 2, 2, 3),
        timestep=torch.tensor([500.0, 30.0]).to(torch.bfloat16),
        encoder_hidden_states=r(2, 5, 16),
        encoder_attention_mask=torch.ones(2, 5),
        encoder_hidden_states_2=r(2, 3, 8),
        encoder_attention_mask_2=torch.ones(2, 3),
        image_embeds=r(2, 4, 8),
        return_dict=False,
    )
    return _randomize(model), kw, "encoder_attention_mask", 2


@pytest.mark.slow
@pytest.mark.parametrize("name", ["chroma", "framepack", "hunyuan15"])
@torch.no_grad()
def test_fp8_variants(name, monkeypatch):
    """All-True masks: the 8-bit path, close to unpatched. The last prompt padded: HunyuanVideo
    1.5's token mask and FramePack's joint mask at batch 2 are key-padding masks -- 8-bit,
    close to the unpatched padded model (FramePack at batch 1 drops the padded tokens itself
    and passes no mask: 8-bit too); Chroma's query x key mask: no 8-bit launch, bitwise
    ``patch(attention=True)``."""
    model, kw, mask_arg, calls = _variant(name)
    model = to_dtype(model, torch.bfloat16)
    padded = dict(kw)
    padded[mask_arg] = kw[mask_arg].clone()
    padded[mask_arg][-1, -2:] = 0
    cases = {"": (kw, model(**kw)[0]), "padded": (padded, model(**padded)[0])}
    if name == "framepack":
        kw2 = _batch2(kw)
        kw2[mask_arg][-1, -2:] = 0
        cases["padded, batch 2"] = (kw2, model(**kw2)[0])
    ditfuse.patch(model, attention="fp8")
    seen = _spy(monkeypatch)
    for case, (inputs, ref) in cases.items():
        seen.clear()
        out = model(**inputs)[0]
        if name == "chroma" and case:
            assert not seen, seen
            ditfuse.unpatch(model)
            ditfuse.patch(model)
            assert torch.equal(out, model(**inputs)[0])
            continue
        assert len(seen) == calls, seen
        assert torch.isfinite(ref).all() and torch.isfinite(out).all()
        cos, rel = _accuracy(out, ref)
        print(f"{name} {case}: cosine {cos:.6f}, relative L2 {rel:.4f} ({len(seen)} 8-bit calls)")
        assert cos >= COS_MIN and rel <= REL_L2_MAX, (case, cos, rel)


@pytest.mark.slow
@torch.no_grad()
def test_fp8_wan_animate2(monkeypatch):
    from test_patch_wan_animate2 import LAYERS, _inputs, _model, _run

    model = to_dtype(_model(dim=128), torch.bfloat16)  # 2 heads of 64
    extract, cached = _inputs(torch.bfloat16)
    ref, _ = _run(model, extract, cached)
    report = ditfuse.patch(model, attention="fp8")
    assert report.counts.get(_FP8_LABEL) == 2 * LAYERS, report.counts
    seen = _spy(monkeypatch)
    out, _ = _run(model, extract, cached)
    # extract: self-attention + cross-attention (text and CLIP keys) a layer; cached: the
    # cross-attention's two (the flex block-mask self-attention stays 16-bit)
    assert len(seen) == 5 * LAYERS, seen
    cos, rel = _accuracy(out, ref)
    print(f"wan-animate-2: cosine {cos:.6f}, relative L2 {rel:.4f} ({len(seen)} 8-bit calls)")
    assert cos >= COS_MIN and rel <= REL_L2_MAX, (cos, rel)
    ditfuse.unpatch(model)
    assert torch.equal(_run(model, extract, cached)[0], ref)


@torch.no_grad()
def test_wan_gpu_route_hands_output_rows8_to_fp8_projection(monkeypatch):
    """With both 8-bit paths on the sm_90 route, Wan's self- and cross-attention ask the
    warp-specialized kernel for its e4m3 output (the stand-in: exact SDPA, then the
    reference quantization) and the FP8 output projections take it; with ``linear`` in
    16 bits they do not. The model stays close to the unpatched one."""
    name, make, inputs, calls = next(c for c in FP8_CASES if c[0] == "wan-t2v")
    model = to_dtype(make(), torch.bfloat16)
    kw = inputs(torch.bfloat16)
    ref = model(**kw)[0]
    ws = _gpu_route(monkeypatch)
    ditfuse.patch(model, attention="fp8", linear="fp8")
    out = model(**kw)[0]
    assert len(ws) == calls and all(r[-1] for r in ws), ws
    cos = torch.nn.functional.cosine_similarity(out.float().flatten(), ref.float().flatten(), 0)
    assert cos >= 0.995, cos
    ditfuse.unpatch(model)
    ws.clear()
    ditfuse.patch(model, attention="fp8")
    model(**kw)
    assert len(ws) == calls and not any(r[-1] for r in ws), ws
