"""``ditfuse.patch`` on the VAEs: every norm -> SiLU pair of FLUX's AutoencoderKL (and
FLUX.2's, the same blocks), HunyuanVideo's, Wan's and Qwen-Image's VAE as one kernel.

Tiny random VAEs (no downloads): the patched decode / encode against the unpatched one (fp32
within a few fp32 roundings, 16-bit within the pairs' contract), every fused pair checked
against the fp64 chain of the two modules on the very input it gets, the kernels actually
called, unpatch bitwise, the fallbacks (autograd, strided input, other parameter dtypes),
the report, and the structure of diffusers' forwards the patch relies on (the activation
called only right after the norms)."""

import inspect
import re

import pytest
import torch
import torch.nn.functional as F
from conftest import DEVICE

import ditfuse
from ditfuse.patching import vae as _vae
from ditfuse.reference import group_norm_silu_chain, rms_norm_silu_channels_chain
from ditfuse.tolerances import PATCHED_VAE
from ditfuse.tools import gn_contract as gc
from ditfuse.tools.tiny_models import VAE_CASES, _randomize, to_dtype, vae_inputs

pytestmark = pytest.mark.filterwarnings("ignore:There are modules in")


VAES = {c[0]: c for c in VAE_CASES}
#: fused pairs of each tiny VAE (encoder + decoder), counted by class name in test_pair_counts
PAIRS = {c[0]: c[4] for c in VAE_CASES}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _make(name, dtype, seed=0):
    _, make, zshape, xshape, _ = VAES[name]
    vae = to_dtype(_randomize(make(), seed), dtype).to(DEVICE).eval()
    z, x = vae_inputs(zshape, xshape, dtype, seed + 1)
    return vae, z.to(DEVICE), x.to(DEVICE)


def _run(vae, z, x):
    with torch.no_grad():
        dec = vae.decode(z).sample
        enc = vae.encode(x).latent_dist.mean
    return dec, enc


@pytest.fixture
def spy(monkeypatch):
    """Counts the kernel calls the fused norms make, and checks each against the fp64 chain
    of the two modules it replaces on the input it got."""
    calls = {"gn": 0, "rms": 0}
    gn, rms = _vae.group_norm_silu, _vae.rms_norm_silu_channels

    def gn_spy(x, G, w, b, eps):
        y = gn(x, G, w, b, eps)
        calls["gn"] += 1
        chain = group_norm_silu_chain(x, G, w, b, eps)
        p = gc.parity(y, chain.out, chain)
        assert p.ok, p.describe()
        return y

    def rms_spy(x, g, b, eps, scale):
        y = rms(x, g, b, eps, scale=scale)
        calls["rms"] += 1
        chain = rms_norm_silu_channels_chain(x, g, b, eps, scale=scale)
        p = gc.parity(y, chain.out, chain)
        assert p.ok, p.describe()
        return y

    monkeypatch.setattr(_vae, "group_norm_silu", gn_spy)
    monkeypatch.setattr(_vae, "rms_norm_silu_channels", rms_spy)
    return calls


@pytest.fixture
def no_tf32():
    """fp32 convolutions and matmuls in fp32 for the test, restored after it. Not
    ``monkeypatch``: these flags are properties of torch's backend modules, and pytest >= 9.2
    records them as absent and then fails deleting them at teardown (which also left the
    ``spy`` fixture's patches in place for the tests after)."""
    flags = [(torch.backends.cudnn, "allow_tf32"), (torch.backends.cuda.matmul, "allow_tf32")]
    saved = [getattr(m, n) for m, n in flags]
    for m, n in flags:
        setattr(m, n, False)
    yield
    for (m, n), v in zip(flags, saved):
        setattr(m, n, v)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(VAES))
def test_patched_vae_matches_unpatched(name, dtype, spy, no_tf32):
    # fp32 convolutions in fp32 (cuDNN's default TF32 would round their inputs to 10 bits,
    # turning the pairs' fp32-rounding differences into 1e-4-sized ones: H200, 2026-12-02)
    vae, z, x = _make(name, dtype)
    ref = _run(vae, z, x)
    report = ditfuse.patch(vae)
    assert report.counts == {_vae.LABEL: PAIRS[name]}, report
    out = _run(vae, z, x)
    assert spy["gn"] + spy["rms"] >= PAIRS[name]  # every pair ran on the kernel (decode + encode)
    assert (spy["rms"] > 0) == (name in ("wan", "wan22", "qwen"))
    for o, r in zip(out, ref):
        assert o.shape == r.shape and o.dtype == r.dtype
        err = (o.float() - r.float()).abs().max().item()
        scale = r.float().abs().max().item()
        # fp32: the statistics' summation order, through the convolutions; 16-bit: a pair's
        # one-rounding differences, amplified by the layers after it
        assert err <= PATCHED_VAE[dtype] * scale, (name, err, scale)
    bound = sum("forward" in m.__dict__ for m in vae.modules())  # the norms + the activations
    assert bound > PAIRS[name]
    assert ditfuse.unpatch(vae) == bound
    back = _run(vae, z, x)
    assert all(torch.equal(b, r) for b, r in zip(back, ref))


@pytest.mark.parametrize("name", list(VAES))
def test_pair_counts(name):
    vae, _, _ = _make(name, torch.float32)
    blocks = [
        m
        for m in vae.modules()
        if re.search(r"(ResnetBlock2D|ResnetBlockCausal3D|ResidualBlock)$", type(m).__name__)
    ]
    assert 2 * len(blocks) + 2 == PAIRS[name]  # + the encoder's and the decoder's heads


@pytest.mark.parametrize("name", list(VAES))
def test_unpatch_restores_every_module(name):
    vae, z, x = _make(name, torch.float32)
    ditfuse.patch(vae)
    ditfuse.patch(vae)  # twice: harmless
    assert ditfuse.patch(vae).counts == {}
    ditfuse.unpatch(vae)
    assert not any("forward" in m.__dict__ for m in vae.modules())


def test_fallbacks_compute_the_modules(spy):
    """Autograd, a strided input, a weight of another dtype: the original GroupNorm + SiLU."""
    vae, z, x = _make("kl", torch.float32)
    ditfuse.patch(vae)
    block = vae.decoder.up_blocks[0].resnets[0]
    norm, act = block.norm1, block.nonlinearity
    h = torch.randn(2, norm.num_channels, 6, 10, device=DEVICE)
    want = F.silu(F.group_norm(h, norm.num_groups, norm.weight, norm.bias, norm.eps))
    assert torch.equal(act(h), h)  # the block's SiLU: applied by the norm before it
    with torch.no_grad():
        strided = torch.randn(2, norm.num_channels, 6, 20, device=DEVICE)[..., ::2]
        assert torch.equal(
            norm(strided),
            F.silu(F.group_norm(strided, norm.num_groups, norm.weight, norm.bias, norm.eps)),
        )
    assert spy["gn"] == 0
    hg = h.clone().requires_grad_(True)
    y = norm(hg)  # autograd needs gradients: the modules, differentiable
    y.sum().backward()
    assert hg.grad is not None and torch.allclose(y.detach(), want, atol=0, rtol=0)
    with torch.no_grad():
        y = norm(h)
    assert spy["gn"] == 1
    assert torch.allclose(y, want, atol=1e-5, rtol=1e-5)


def test_rms_fallback_other_gamma_dtype(spy):
    """Wan's norm with an fp32 gamma on bf16 activations promotes to fp32 in eager: the
    patched norm runs the modules (the kernel would return bf16)."""
    vae, z, x = _make("wan", torch.bfloat16)
    ditfuse.patch(vae)
    block = vae.decoder.mid_block.resnets[0]
    norm = block.norm1
    norm.gamma.data = norm.gamma.data.float()
    h = torch.randn(1, norm.gamma.shape[0], 2, 4, 4, device=DEVICE).to(torch.bfloat16)
    with torch.no_grad():
        y = norm(h)
        eager = F.silu(type(norm).forward(norm, h))
    assert spy["rms"] == 0 and y.dtype == eager.dtype == torch.float32 and torch.equal(y, eager)


def test_pipeline_patches_the_vae_and_vae_false_skips_it():
    vae, z, x = _make("kl", torch.float32)

    class Pipe:
        components = {"vae": vae, "scheduler": object()}

    r = ditfuse.patch(Pipe(), vae=False)
    assert r.counts == {} and "vae=False" in str(r)
    r = ditfuse.patch(Pipe())
    assert r.counts == {_vae.LABEL: PAIRS["kl"]} and "vae: AutoencoderKL" in str(r)
    ditfuse.unpatch(Pipe())


def test_shared_activation_is_left_alone():
    """A block whose activation module is shared with another block is not patched (the
    identity would reach the other block too)."""
    vae, z, x = _make("kl", torch.float32)
    blocks = [b for b in vae.decoder.modules() if type(b).__name__ == "ResnetBlock2D"]
    blocks[1].nonlinearity = blocks[0].nonlinearity
    r = ditfuse.patch(vae)
    assert r.counts[_vae.LABEL] == PAIRS["kl"] - 4
    assert "forward" not in blocks[0].norm1.__dict__ and "forward" not in blocks[1].norm2.__dict__


def _calls(src: str, attr: str):
    return [m.start() for m in re.finditer(rf"self\.{attr}\(", src)]


def test_diffusers_blocks_call_the_activation_only_after_their_norms():
    """What the patch relies on, read from the installed diffusers' code: in every patched
    block class, each call of the activation module follows a call of one of the norms on the
    line before it (``x = self.norm(x)`` then ``x = self.act(x)``), and the activation is
    called once per norm (ResnetBlock2D: once more on the time embedding, which the patch
    excludes by requiring ``time_emb_proj is None``)."""
    for cls, (norms, act, cond) in _vae._specs().items():
        src = inspect.getsource(cls.forward)
        lines = [
            ln.strip() for ln in src.splitlines() if ln.strip() and not ln.strip().startswith("#")
        ]
        uses = [i for i, ln in enumerate(lines) if re.search(rf"self\.{act}\(", ln)]
        after = [i for i in uses if any(re.search(rf"self\.{n}\(", lines[i - 1]) for n in norms)]
        other = [lines[i] for i in uses if i not in after]
        if cls.__name__ == "ResnetBlock2D":
            assert other == ["temb = self.nonlinearity(temb)"], other
            assert cond is not None
        else:
            assert not other, (cls.__name__, other)
        assert len(after) == len(norms), (cls.__name__, lines)


@pytest.mark.parametrize("name", ["hunyuan", "wan"])
def test_compile_traces_the_modules(name, spy):
    """Under torch.compile (fullgraph) the patched 5-D VAEs trace the modules' own norm and
    SiLU (inductor fuses them with their neighbours: measured faster there than the kernels
    in the graph, ``_vae``'s docstring): the compiled patched code computes what the
    unpatched eager code does, bit for bit here (the same aten ops), and calls no kernel."""
    vae, z, x = _make(name, torch.bfloat16)
    ditfuse.patch(vae)
    block = vae.decoder.mid_block.resnets[0]
    norm = block.norm1
    C = norm.num_channels if isinstance(norm, torch.nn.GroupNorm) else norm.gamma.shape[0]
    h = torch.randn(1, C, 2, 8, 8, device=DEVICE).to(torch.bfloat16)
    with torch.no_grad():
        got = torch.compile(block, fullgraph=True, backend="aot_eager")(h)
        ditfuse.unpatch(vae)
        want = block(h)
    assert spy["gn"] == spy["rms"] == 0
    assert torch.equal(got, want)


@pytest.mark.parametrize(
    "layout", [pytest.param("contiguous", marks=pytest.mark.slow), "channels_last"]
)
def test_compile_keeps_the_4d_kernels_in_the_graph(layout):
    """FLUX's AutoencoderKL under torch.compile (fullgraph) keeps its GroupNorm pairs on the
    kernel: the graph calls ``ditfuse::group_norm_silu`` once a pair (no SiLU left, no module
    norm but the attention block's), and computes the eager patched decoder's bits (the same
    kernel launches), in the layout inductor hands it (channels-last: the "split-cl" path)."""
    vae, z, x = _make("kl", torch.bfloat16)
    ditfuse.patch(vae)
    pairs = sum(1 for m in vae.decoder.modules() if _vae._ACT in m.__dict__)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
    with torch.no_grad():
        h = vae.post_quant_conv(z).contiguous(memory_format=fmt)
        vae.decoder.to(memory_format=fmt)
        got = torch.compile(vae.decoder, fullgraph=True, backend=backend)(h)
        want = vae.decoder(h)
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert targets.count("ditfuse.group_norm_silu") == pairs > 0, targets
    # the attention block's GroupNorm (no SiLU after it) is the only module norm left
    plain = sum(
        1
        for m in vae.decoder.modules()
        if isinstance(m, torch.nn.GroupNorm) and _vae._ACT not in m.__dict__
    )
    assert sum("group_norm" in t and "ditfuse" not in t for t in targets) == plain, targets
    assert not any("silu" in t and "ditfuse" not in t for t in targets), targets
    assert torch.equal(got, want)
