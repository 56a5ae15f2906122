"""``ditfuse.patch(model, linear="fp8")``: the DiT block linears as FP8 GEMMs on the tiny models
of every family (Wan, FLUX.1, FLUX.2, HunyuanVideo, Qwen-Image), bf16 on the CPU (the GEMM is
torch._scaled_mm's CPU kernel, the quantizer runs through Triton's interpreter): every layer
the patch names as FP8 really runs the FP8 path (a spy), the output stays close to the
unpatched model's, the report names every block linear with its precision, the modulation
linears stay 16-bit, ``unpatch`` gives back every weight bitwise and the original output
bitwise; fp32 models and excluded names stay exact; bad values are rejected."""

import pytest
import torch

import ditfuse
from ditfuse.patching import linear_fp8 as _linear_fp8

diffusers = pytest.importorskip("diffusers")
from ditfuse.tools.tiny_models import FP8_CASES, to_dtype  # noqa: E402

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="the tiny models run on the CPU, where the quantizer runs through Triton's interpreter",
)

# A whole tiny model with every block linear in e4m3 x e4m3 (3 mantissa bits each operand)
# against the bf16 model: each GEMM's ~0.03 relative error compounds over the 4-8 linears
# a token passes (one GEMM alone: tests/test_linear_fp8.py, 0.999 / 0.05). Measured on these
# models (bf16, CPU) 0.9971-0.9998 / 0.018-0.088.
COS_MIN = 0.995
REL_L2_MAX = 0.1

_CASES = {c[0]: c for c in FP8_CASES if c[0] != "wan-i2v"}


def _spy(monkeypatch):
    calls = []
    real = _linear_fp8.linear_fp8

    def run(x, w_q, w_scale, bias=None, **kw):
        calls.append(tuple(w_q.shape))
        return real(x, w_q, w_scale, bias, **kw)

    monkeypatch.setattr(_linear_fp8, "linear_fp8", run)
    return calls


def _accuracy(out, ref):
    o, r = out.float().flatten(), ref.float().flatten()
    cos = torch.nn.functional.cosine_similarity(o, r, dim=0).item()
    return cos, ((o - r).norm() / r.norm()).item()


def _block_linears(model):
    return {
        n: m
        for n, m in model.named_modules()
        if type(m) is torch.nn.Linear and "blocks" in n.split(".", 1)[0]
    }


@pytest.mark.parametrize("case", sorted(_CASES))
def test_linear_fp8_model(case, monkeypatch):
    _, make, inputs, _ = _CASES[case]
    model = to_dtype(make(), torch.bfloat16)
    kw = inputs(torch.bfloat16)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    saved_names = set(_block_linears(model))
    with torch.no_grad():
        ref = model(**kw)[0]
    rep = ditfuse.patch(
        model, qk_norm_rope=False, adaln=False, attention=False, activations=False, linear="fp8"
    )
    text = str(rep)
    linears = _block_linears(model)
    fp8 = [n for n in linears if f"  {n}: fp8 " in text]
    fused = [n for n in linears if f"  {n}: fused into " in text]
    kept = [n for n in linears if n not in fp8 and n not in fused]
    # Q / K / V fused into one FP8 GEMM where the attention class takes it (Wan, FLUX.1/2)
    assert bool(fused) == (case in ("wan-t2v", "flux1", "flux2")), fused
    for n in fused:
        target = text.split(f"  {n}: fused into ")[1].split("\n")[0]
        assert target in fp8, (n, target)
    assert fp8, text
    # every block linear is named with its precision; the modulation ones stay 16-bit
    for n in linears:
        assert f"  {n}: " in text, n
    for n in kept:
        assert any(p in n for p in ("norm", "mod", "emb")), (n, text)
    assert rep.counts[_linear_fp8.LABEL] == len(fp8)
    calls = _spy(monkeypatch)
    with torch.no_grad():
        out = model(**kw)[0]
    assert len(calls) >= len(fp8)
    assert {tuple(linears[n]._ditfuse_w8.shape) for n in fp8} == set(calls)
    cos, rel = _accuracy(out, ref)
    print(f"{case}: cos {cos:.5f} rel L2 {rel:.4f}")
    assert cos >= COS_MIN and rel <= REL_L2_MAX, (cos, rel)
    assert rel > 0  # the 8-bit GEMMs really ran
    # the 16-bit weights left the module; unpatch gives them back bitwise
    assert all(linears[n].weight.numel() == 0 for n in fp8 + fused)
    assert ditfuse.unpatch(model) >= len(fp8)
    for k, v in model.state_dict().items():
        assert torch.equal(v, saved[k]), k
    assert not any("_ditfuse_w8" in k for k, _ in model.named_buffers())
    assert set(_block_linears(model)) == {n for n in linears if n not in fp8 or n in saved_names}
    with torch.no_grad():
        again = model(**kw)[0]
    assert torch.equal(again, ref)


def test_linear_fp8_with_all_fusions():
    _, make, inputs, _ = _CASES["wan-t2v"]
    model = to_dtype(make(), torch.bfloat16)
    kw = inputs(torch.bfloat16)
    with torch.no_grad():
        ref = model(**kw)[0]
    rep = ditfuse.patch(model, attention="fp8", linear="fp8")
    assert rep.counts[_linear_fp8.LABEL] > 0
    with torch.no_grad():
        out = model(**kw)[0]
    cos, rel = _accuracy(out, ref)
    assert cos >= COS_MIN and rel <= REL_L2_MAX, (cos, rel)
    ditfuse.unpatch(model)
    with torch.no_grad():
        assert torch.equal(model(**kw)[0], ref)


@pytest.mark.parametrize("attention", [pytest.param(True, marks=pytest.mark.slow), "fp8"])
def test_wan_blocks_hand_rows8(attention, monkeypatch):
    """Wan's fused block forward writes the self-attention's, the cross-attention's and the
    FFN's inputs in e4m3 from the AdaLN kernels (``quantize="fp8"``, taken by every block):
    the model's output bitwise what it is when the FP8 linears quantize those inputs
    themselves."""
    from ditfuse.patching import wan

    _, make, inputs, _ = _CASES["wan-t2v"]
    model = to_dtype(make(), torch.bfloat16)
    kw = inputs(torch.bfloat16)
    ditfuse.patch(model, attention=attention, linear="fp8")
    quantized = []
    real_mod, real_gra = wan.adaln_modulate, wan.gated_residual_adaln

    def mod(*a, quantize=None, **k):
        quantized.append(("norm1", quantize))
        return real_mod(*a, quantize=quantize, **k)

    def gra(*a, quantize=None, **k):
        quantized.append(("norm", quantize))
        return real_gra(*a, quantize=quantize, **k)

    monkeypatch.setattr(wan, "adaln_modulate", mod)
    monkeypatch.setattr(wan, "gated_residual_adaln", gra)
    with torch.no_grad():
        fused = model(**kw)[0]
    n_blocks = len(model.blocks)
    assert quantized.count(("norm1", "fp8")) == n_blocks, quantized
    # the cross-attention's input (gated residual + norm2) and the FFN's
    assert quantized.count(("norm", "fp8")) == 2 * n_blocks, quantized
    monkeypatch.setattr(wan, "rows8_ok", lambda attn, x, cross=False: False)
    monkeypatch.setattr(wan, "ffn_takes_rows8", lambda ffn, x: False)
    quantized.clear()
    with torch.no_grad():
        separate = model(**kw)[0]
    assert ("norm1", "fp8") not in quantized and ("norm", "fp8") not in quantized
    assert torch.equal(fused, separate)


# the linears whose output feeds only the block's gated residual (fnmatch on module names)
_TAKE_RESIDUAL = {
    "wan-t2v": ("blocks.*.ffn.net.2",),
    "flux1": (
        "transformer_blocks.*.ff.net.2",
        "transformer_blocks.*.ff_context.net.2",
        "single_transformer_blocks.*.proj_out",
    ),
    "flux2": (
        "transformer_blocks.*.ff.linear_out",
        "transformer_blocks.*.ff_context.linear_out",
        "single_transformer_blocks.*.attn.to_out",
    ),
    "hunyuan-video": (
        "transformer_blocks.*.ff.net.2",
        "transformer_blocks.*.ff_context.net.2",
        "single_transformer_blocks.*.proj_out",
    ),
    "qwen-image": ("transformer_blocks.*.img_mlp.net.2", "transformer_blocks.*.txt_mlp.net.2"),
}


@pytest.mark.parametrize("case", sorted(_TAKE_RESIDUAL))
def test_residual_handed_to_the_gemm(case, monkeypatch):
    """With every fusion on, the FFNs' output projections (Wan, FLUX.1, FLUX.2 and
    HunyuanVideo's double-stream blocks, both streams of Qwen-Image's) and the single-stream
    blocks' output projections (FLUX.1 and HunyuanVideo's ``proj_out``, FLUX.2's
    ``attn.to_out`` inside its processor)
    take the block's gated residual into their GEMM (``linear_fp8(..., residual=)``), every one
    of them and no other: the model's output bitwise what it is with the residual added after
    the GEMM."""
    import fnmatch

    _, make, inputs, _ = _CASES[case]
    model = to_dtype(make(), torch.bfloat16)
    kw = inputs(torch.bfloat16)
    ditfuse.patch(model, linear="fp8")
    names = {
        id(m._buffers["_ditfuse_w8"]): n
        for n, m in model.named_modules()
        if "_ditfuse_w8" in m._buffers
    }
    took = set()
    real = _linear_fp8.linear_fp8

    def run(x, w_q, w_scale, bias=None, **k):
        if k.get("residual") is not None:
            took.add(names[id(w_q)])
        return real(x, w_q, w_scale, bias, **k)

    monkeypatch.setattr(_linear_fp8, "linear_fp8", run)
    with torch.no_grad():
        fused = model(**kw)[0]
    want = {n for n in names.values() if any(fnmatch.fnmatch(n, p) for p in _TAKE_RESIDUAL[case])}
    assert want and all(any(fnmatch.fnmatch(n, p) for n in want) for p in _TAKE_RESIDUAL[case])
    assert took == want, (took, want)
    monkeypatch.setattr(_linear_fp8, "_takes_residual", lambda linear, x: False)
    took.clear()
    with torch.no_grad():
        separate = model(**kw)[0]
    assert not took
    assert torch.equal(fused, separate)


def test_flux2_single_block_residual_not_handed_past_a_hook(monkeypatch):
    """A forward hook on a FLUX.2 single-stream block's attention sees the attention's output,
    not the new stream: that block adds its residual after the call; the model's output is the
    same bits either way."""
    _, make, inputs, _ = _CASES["flux2"]
    model = to_dtype(make(), torch.bfloat16)
    kw = inputs(torch.bfloat16)
    ditfuse.patch(model, linear="fp8")
    with torch.no_grad():
        plain = model(**kw)[0]
    attn = model.single_transformer_blocks[0].attn
    seen = []
    handle = attn.register_forward_hook(lambda mod, args, kwargs_out: seen.append(kwargs_out))
    residuals = []
    real = _linear_fp8.linear_fp8

    def run(x, w_q, w_scale, bias=None, **k):
        residuals.append(w_q is attn.to_out._ditfuse_w8 and k.get("residual") is not None)
        return real(x, w_q, w_scale, bias, **k)

    monkeypatch.setattr(_linear_fp8, "linear_fp8", run)
    with torch.no_grad():
        hooked = model(**kw)[0]
    handle.remove()
    assert len(seen) == 1 and seen[0].shape[-1] == attn.to_out.out_features
    assert not any(residuals)
    assert torch.equal(hooked, plain)


def test_rows8_not_handed_past_hooks():
    """A hook on the self-attention or its projection (it would see the e4m3 rows) or a block
    linear in 16 bits keeps the 16-bit input."""
    from ditfuse.patching import wan

    _, make, inputs, _ = _CASES["wan-t2v"]
    model = to_dtype(make(), torch.bfloat16)
    ditfuse.patch(model, linear="fp8")
    attn, cross = model.blocks[0].attn1, model.blocks[0].attn2
    x = torch.empty(1, 1, attn.to_qkv.in_features, dtype=torch.bfloat16)
    assert wan.rows8_ok(attn, x) and wan.rows8_ok(cross, x, cross=True)
    assert not wan.rows8_ok(attn, x.float())
    assert not wan.rows8_ok(cross, x.float(), cross=True)
    for a, hook, c in (
        (attn, attn.register_forward_pre_hook, False),
        (attn, attn.to_qkv.register_forward_hook, False),
        (cross, cross.register_forward_pre_hook, True),
        (cross, cross.to_q.register_forward_hook, True),
    ):
        h = hook(lambda *a: None)
        assert not wan.rows8_ok(a, x, cross=c)
        h.remove()
    assert wan.rows8_ok(attn, x) and wan.rows8_ok(cross, x, cross=True)
    model2 = to_dtype(make(), torch.bfloat16)
    ditfuse.patch(model2, linear="fp8", linear_exclude=("*to_q*", "*norm*"))
    assert not wan.rows8_ok(model2.blocks[0].attn1, x)
    assert not wan.rows8_ok(model2.blocks[0].attn2, x, cross=True)


@pytest.mark.parametrize("case", ["wan-t2v", "wan-i2v"])
def test_wan_attention_hands_rows8_to_output_projection(case, monkeypatch):
    """With both 8-bit paths, Wan's attention writes its output as e4m3 rows for the FP8
    output projection (``quantize_out="fp8"``: one scale a batch entry from V's bound), in
    every self- and cross-attention call of the CPU run but I2V's cross-attention (two
    attentions summed: 16 bits); the model stays as close to the 16-bit one as with the
    projection quantizing per token, and within a hair of it."""
    from ditfuse.patching import wan

    _, make, inputs, _ = next(c for c in FP8_CASES if c[0] == case)
    model = to_dtype(make(), torch.bfloat16)
    kw = inputs(torch.bfloat16)
    with torch.no_grad():
        ref = model(**kw)[0]
    ditfuse.patch(model, attention="fp8", linear="fp8")
    kinds = []
    real = wan.attention_8bit_i2v

    def spy(*a, **k):
        out = real(*a, **k)
        kinds.append(type(out).__name__)
        return out

    monkeypatch.setattr(wan, "attention_8bit_i2v", spy)
    with torch.no_grad():
        handed = model(**kw)[0]
    cross = "Tensor" if case == "wan-i2v" else "Rows8"
    assert kinds == ["Rows8", cross] * len(model.blocks), kinds
    monkeypatch.setattr(wan, "out_rows8_ok", lambda attn, v: False)
    kinds.clear()
    with torch.no_grad():
        per_token = model(**kw)[0]
    assert kinds == ["Tensor"] * (2 * len(model.blocks)), kinds
    cos_h, rel_h = _accuracy(handed, ref)
    cos_t, rel_t = _accuracy(per_token, ref)
    assert cos_h >= COS_MIN and rel_h <= REL_L2_MAX, (cos_h, rel_h)
    assert rel_h <= rel_t * 1.25 + 0.005, (rel_h, rel_t)
    cos, rel = _accuracy(handed, per_token)
    assert cos >= 0.999 and rel <= 0.05, (cos, rel)


def test_output_rows8_not_handed_past_hooks():
    """A hook on the output projection (it would see the e4m3 rows), or the projection left
    in 16 bits, keeps the 16-bit attention output."""
    from ditfuse.patching import wan

    _, make, _, _ = _CASES["wan-t2v"]
    model = to_dtype(make(), torch.bfloat16)
    ditfuse.patch(model, attention="fp8", linear="fp8")
    attn = model.blocks[0].attn1
    v = torch.empty(1, 1, attn.to_out[0].in_features, dtype=torch.bfloat16)
    assert wan.out_rows8_ok(attn, v) and not wan.out_rows8_ok(attn, v.half())
    h = attn.to_out[0].register_forward_pre_hook(lambda *a: None)
    assert not wan.out_rows8_ok(attn, v)
    h.remove()
    assert wan.out_rows8_ok(attn, v)
    model2 = to_dtype(make(), torch.bfloat16)
    ditfuse.patch(model2, attention="fp8", linear="fp8", linear_exclude=("*to_out*",))
    assert not wan.out_rows8_ok(model2.blocks[0].attn1, v)


def test_patch_twice_and_exclude():
    _, make, _, _ = _CASES["flux1"]
    model = to_dtype(make(), torch.bfloat16)
    r1 = ditfuse.patch(model, linear="fp8", linear_exclude=("*ff*",))
    n1 = r1.counts[_linear_fp8.LABEL]
    assert "(excluded: *ff*)" in str(r1)
    for n, m in _block_linears(model).items():
        if ".ff" in n:
            assert "_ditfuse_w8" not in m._buffers, n
    r2 = ditfuse.patch(model, linear="fp8")  # a second patch adds the rest, requantizes nothing
    assert r2.counts.get(_linear_fp8.LABEL, 0) > 0
    assert r2.counts[_linear_fp8.LABEL] + n1 == len(
        [m for m in _block_linears(model).values() if "_ditfuse_w8" in m._buffers]
    )


def test_fp32_model_stays_exact():
    _, make, inputs, _ = _CASES["wan-t2v"]
    model = make()  # fp32
    rep = ditfuse.patch(model, linear="fp8")
    assert not rep.counts.get(_linear_fp8.LABEL)
    assert "exact (torch.float32 weights" in str(rep)


def test_bad_values():
    model = to_dtype(_CASES["wan-t2v"][1](), torch.bfloat16)
    with pytest.raises(ValueError, match="linear must be None or 'fp8'"):
        ditfuse.patch(model, linear="int8")
    with pytest.raises(ValueError, match="linear_exclude"):
        ditfuse.patch(model, linear="fp8", linear_exclude="*norm*")
    ditfuse.patch(model, linear="fp8")
    with pytest.raises(RuntimeError, match="inference-only"):
        lin = model.blocks[0].attn1.to_out[0]
        lin(torch.randn(2, lin.in_features, dtype=torch.bfloat16, requires_grad=True))


def test_device_without_fp8(monkeypatch):
    from ditfuse.ops import linear_fp8 as ops

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert not ops.fp8_gemm_ok(torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert ops.fp8_gemm_ok(torch.device("cuda"))
    # a model on a device without FP8 GEMMs: every layer exact, the report says why
    monkeypatch.setattr(_linear_fp8, "fp8_gemm_ok", lambda device: False)
    model = to_dtype(_CASES["wan-t2v"][1](), torch.bfloat16)
    rep = ditfuse.patch(model, linear="fp8")
    assert not rep.counts.get(_linear_fp8.LABEL)
    assert "has no FP8 tensor cores (sm_89 or newer)" in str(rep)
    assert all(m.weight.numel() for m in _block_linears(model).values())


class _LoraLike(torch.nn.Module):
    """An adapter wrapper shaped as peft's LoRA layer (``base_layer``, ``lora_A`` /
    ``lora_B`` module dicts of a rank's width, ``merge`` / ``unmerge`` into the base weight),
    for machines without peft: ditfuse's rule is about the structure."""

    def __init__(self, base: torch.nn.Linear, rank: int = 16):
        super().__init__()
        self.base_layer = base
        mk = dict(bias=False, dtype=base.weight.dtype, device=base.weight.device)
        self.lora_A = torch.nn.ModuleDict(
            {"default": torch.nn.Linear(base.in_features, rank, **mk)}
        )
        self.lora_B = torch.nn.ModuleDict(
            {"default": torch.nn.Linear(rank, base.out_features, **mk)}
        )
        self.merged = False

    def delta(self):
        return self.lora_B["default"].weight @ self.lora_A["default"].weight

    def merge(self):
        self.base_layer.weight.data += self.delta()
        self.merged = True

    def unmerge(self):
        self.base_layer.weight.data -= self.delta()
        self.merged = False

    def forward(self, x):
        y = self.base_layer(x)
        if not self.merged:
            y = y + self.lora_B["default"](self.lora_A["default"](x))
        return y


def test_adapter_layers_stay_16_bit():
    """A LoRA-wrapped block linear: its base layer runs in FP8, the adapter's own linears
    (a rank's width, which FP8 would quantize again for nothing) stay 16-bit and bitwise
    untouched, the wrapper's output is the FP8 base plus the adapter's 16-bit term, a merge
    into the FP8 weight raises a clear error (it would add to the emptied weight), and unpatch
    gives the merge back."""
    _, make, inputs, _ = _CASES["wan-t2v"]
    model = to_dtype(make(), torch.bfloat16)
    kw = inputs(torch.bfloat16)
    attn = model.blocks[0].attn1
    for p in ("to_q", "to_v"):
        setattr(attn, p, _LoraLike(getattr(attn, p)))
    for m in model.modules():
        if isinstance(m, _LoraLike):
            for d in (m.lora_A, m.lora_B):
                torch.nn.init.normal_(d["default"].weight, std=0.05)
    lora = {n: p.clone() for n, p in model.named_parameters() if ".lora_" in n}
    with torch.no_grad():
        ref = model(**kw)[0]
    rep = ditfuse.patch(model, linear="fp8")
    text = str(rep)
    for p in ("to_q", "to_v"):
        assert f"  blocks.0.attn1.{p}.base_layer: fp8 " in text, text
        for ab in ("lora_A", "lora_B"):
            assert (
                f"  blocks.0.attn1.{p}.{ab}.default: torch.bfloat16 (an adapter's own layer, "
                f"of blocks.0.attn1.{p})" in text
            ), text
    for n, p in model.named_parameters():
        if ".lora_" in n:
            assert torch.equal(p, lora[n]), n
    assert not any(".lora_" in n for n, _ in model.named_buffers())
    x = torch.randn(2, 9, attn.to_q.base_layer.in_features, dtype=torch.bfloat16)
    q = attn.to_q
    with torch.no_grad():
        want = q.base_layer(x) + q.lora_B["default"](q.lora_A["default"](x))
        assert torch.equal(q(x), want)
        out = model(**kw)[0]
    cos, rel = _accuracy(out, ref)
    assert cos >= COS_MIN and rel <= REL_L2_MAX, (cos, rel)
    for method in (q.merge, q.unmerge):
        with pytest.raises(RuntimeError, match="fuse the adapter \\(fuse_lora\\) before patching"):
            method()
    ditfuse.unpatch(model)
    with torch.no_grad():
        assert torch.equal(model(**kw)[0], ref)
    w = q.base_layer.weight.clone()
    q.merge()
    assert torch.equal(q.base_layer.weight, w + q.delta())


def test_peft_lora_fp8():
    """diffusers' own LoRA (peft's layers, rank 16): the adapter's linears stay 16-bit, the
    model stays close to its unpatched self with the adapter, ``fuse_lora`` after the patch
    raises instead of dropping the adapter, and after unpatch it fuses as unpatched."""
    peft = pytest.importorskip("peft")
    _, make, inputs, _ = _CASES["wan-t2v"]
    model = to_dtype(make(), torch.bfloat16)
    kw = inputs(torch.bfloat16)
    targets = ["to_q", "to_k", "to_v", "to_out.0", "net.2"]
    model.add_adapter(peft.LoraConfig(r=16, lora_alpha=16, target_modules=targets))
    for n, p in model.named_parameters():
        if ".lora_" in n:
            torch.nn.init.normal_(p, std=0.05)
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        ref = model(**kw)[0]
    text = str(ditfuse.patch(model, linear="fp8"))
    assert "  blocks.0.attn1.to_q.base_layer: fp8 " in text, text
    assert "  blocks.0.attn1.to_q.lora_A.default: torch.bfloat16 (an adapter's own" in text, text
    assert not any(".lora_" in n for n, _ in model.named_buffers())
    with torch.no_grad():
        out = model(**kw)[0]
    cos, rel = _accuracy(out, ref)
    assert cos >= COS_MIN and rel <= REL_L2_MAX, (cos, rel)
    with pytest.raises(RuntimeError, match="before patching"):
        model.fuse_lora()
    ditfuse.unpatch(model)
    with torch.no_grad():
        assert torch.equal(model(**kw)[0], ref)
    model.fuse_lora()
    with torch.no_grad():
        fused = model(**kw)[0]
    assert _accuracy(fused, ref)[0] > 0.9999
