"""The --e2e machinery on the CPU (interpreter), through the builders the GPU run uses:
every model of E2E_MODELS at its tiny config and sizes (rows printed, CSV written,
patched vs unpatched compared), the real-size input builders (dtypes and shapes of the
diffusers pipelines) and real-size forwards on the meta device, the SAME OOM row, and the
from_pretrained-like cast."""

import csv
import io
import math
import tempfile
from dataclasses import replace

import pytest
import torch

pytest.importorskip("diffusers")

from conftest import DEVICE

import ditfuse
from ditfuse.tolerances import PATCHED_DECODE
from ditfuse.tools import e2e

# wan14b-720p is wan14b-480p's builder and tiny model at another token count: the every-model
# run leaves it out (the tests below that name it run it)
EVERY = [n for n in e2e.E2E_MODELS if n != "wan14b-720p"]
TRANSFORMERS = [n for n in EVERY if e2e.E2E_MODELS[n].kind == "transformer"]

# The slow runs below feed the tiny models fewer tokens than their registry sizes (through
# the same input builders): the interpreter runs a QK-norm + RoPE program a token, so the
# tokens set their cost; FLUX's and HunyuanVideo's grids stay non-square (rows and columns
# told apart), HunyuanVideo keeps two frames and padded prompt tokens (its key-padding mask)
FEWER_TOKENS = {
    "wan14b-480p": {"frames": 1, "h": 4, "w": 4, "text_len": 3},
    "flux1-1024": {"height": 2, "width": 3, "text_len": 3},
    "flux2-1024": {"height": 2, "width": 3, "text_len": 3},
    "hunyuan-video-544p": {"frames": 2, "h": 2, "w": 3, "text_len": 4, "prompt": 2},
}


@pytest.fixture
def fewer_tokens(monkeypatch):
    """E2E_MODELS with :data:`FEWER_TOKENS` as those models' tiny sizes (``tiny=True``)."""
    for n, sizes in FEWER_TOKENS.items():
        monkeypatch.setitem(e2e.E2E_MODELS, n, replace(e2e.E2E_MODELS[n], tiny_sizes=sizes))


@pytest.mark.slow
@pytest.mark.parametrize("name", EVERY)
def test_run_e2e_tiny_every_model(name, tmp_path, fewer_tokens):
    """run_e2e end to end on every model (the tiny configs through the real builders), one
    model a case: the rows print as they finish, the CSV holds every row, transformers'
    trajectories are bitwise equal patched vs unpatched in bf16, SAME's decode agrees within
    rounding. (No compile rows here: test_run_model_compile_rows has them.)"""
    out, path = io.StringIO(), tmp_path / "e2e.csv"
    failed = e2e.run_e2e(
        [name],
        DEVICE,
        1,
        str(path),
        timer=lambda f: (f(), 1.0)[1],
        slow_timer=lambda f: (f(), 2.0)[1],
        compile_backend=None,
        steps=1,
        tiny=True,
        out=out,
        rounds=2,
    )
    log = out.getvalue()
    assert failed == 0, log
    with open(path) as f:
        rows = list(csv.DictReader(f))
    printed = [ln for ln in log.splitlines() if ln.split()[:1] and ln.split()[0] in e2e.E2E_MODELS]
    assert len(rows) == len(printed) == (2 if name in TRANSFORMERS else 12), log
    assert {r["model"] for r in rows} == {name}
    if name in TRANSFORMERS:
        assert [r["impl"] for r in rows] == ["unpatched eager", "patched eager"], log
        assert rows[0]["note"] == "rounds 1.00/1.00", rows  # every round's ms
        assert float(rows[1]["max_abs_diff"]) == 0.0 and math.isinf(float(rows[1]["psnr"])), rows
        return
    timed, vs32 = rows[:8], rows[8:]
    assert len(timed) == 2 * 2 * 2  # dtypes x lengths x impls
    for r in timed:
        assert float(r["ms"]) == 2.0 and not r["note"], r
        if r["impl"] == "patched":
            # tf32 operands for fp32 (the kernel's contract), a few bf16 roundings through 2 layers
            assert float(r["psnr"]) > (58 if r["dtype"] == "float32" else 38), r
    # bf16 decodes against the fp32 one: patched as close as unpatched (rounding, not error)
    assert [(r["impl"], r["dtype"], r["shape"]) for r in vs32] == [
        (i, "bfloat16", f"{n} latents")
        for n in (4, 9)
        for i in ("unpatched vs fp32", "patched vs fp32")
    ]
    for unp, pat in zip(vs32[::2], vs32[1::2]):
        assert float(pat["psnr"]) > float(unp["psnr"]) - 3, (unp, pat)


@pytest.mark.slow
def test_run_model_compile_rows():
    """The four timed variants with torch.compile (dynamo, eager backend) on tiny FLUX.1."""
    rows = []
    spec = e2e.E2E_MODELS["flux1-1024"]
    _, quality, report = e2e.run_model(
        spec,
        DEVICE,
        torch.bfloat16,
        1,
        timer=lambda f: (f(), 1.0)[1],
        emit=rows.append,
        compile_backend="eager",
        steps=1,
        config=spec.tiny_config,
        sizes=FEWER_TOKENS["flux1-1024"],
        rounds=1,
    )
    assert [r["impl"] for r in rows] == [
        "unpatched eager",
        "unpatched compile",
        "patched eager",
        "patched compile",
    ]
    assert report.counts and rows[2]["psnr"] == quality["psnr"]
    assert quality["max_abs_diff"] == 0.0 and math.isinf(quality["psnr"])


@pytest.mark.parametrize("name", list(e2e.E2E_MODELS))
def test_real_size_inputs_and_forward_on_meta(name):
    """The GPU run's own inputs (real config, default sizes) built on the CPU, then the
    real-size model (one block) run on the meta device: the input builders' dtype/shape
    mistakes and any config/input mismatch fail here, not on the GPU."""
    spec = e2e.E2E_MODELS[name]
    with torch.device("meta"):
        model = spec.build(1)
    e2e.as_loaded(model, torch.bfloat16)
    cfg = model.config
    if spec.kind == "vae-decode":
        counts = [e2e.same_latent_count(s, cfg) for s in spec.sizes["seconds"]]
        assert counts == [646, 1938]  # 1 and 3 minutes at 44.1 kHz, 4096 samples per latent
        kw = spec.inputs("cpu", torch.bfloat16, latents=counts[-1], cfg=cfg)
        assert kw["latents"].shape == (1, 256, 1938) and kw["latents"].dtype == torch.bfloat16
        blk = model.decoder.blocks[0]
        assert (blk.transformers[0].attn.heads, blk.transformers[0].attn.dim_heads) == (24, 64)
        assert 1938 * (blk.stride + 1) == 32946 and blk.sliding_window * (blk.stride + 1) == 17
        with torch.no_grad():
            out = model.decode(kw["latents"].to("meta")).sample
        assert out.shape == (1, 2, 1938 * 4096)
        ditfuse.patch(model)  # the patched decode's shapes too (fake kernels on meta)
        with torch.no_grad():
            assert model.decode(kw["latents"].to("meta")).sample.shape == out.shape
        return
    kw = spec.inputs("cpu", torch.bfloat16, cfg=cfg, **spec.sizes)
    meta = {k: v.to("meta") if torch.is_tensor(v) else v for k, v in kw.items()}
    with torch.no_grad():
        out = model(**meta)[0]
    assert out.shape == kw[spec.latent_key].shape and out.dtype == torch.bfloat16


def test_inputs_match_the_pipelines():
    """ids / timestep / guidance dtypes and layouts as diffusers 0.42.1's pipelines make
    them (a non-square grid so rows and columns cannot be swapped unnoticed)."""
    bf = torch.bfloat16
    kw = e2e._flux1_inputs("cpu", bf, height=3, width=5, text_len=7, cfg=e2e.FLUX1_DEV)
    # FluxPipeline._prepare_latent_image_ids: (h*w, 3) = (0, row, col) in the latents' dtype
    want = torch.tensor([[0, r, c] for r in range(3) for c in range(5)], dtype=bf)
    assert kw["img_ids"].dtype == bf and torch.equal(kw["img_ids"], want)
    assert kw["txt_ids"].dtype == bf and kw["txt_ids"].shape == (7, 3) and not kw["txt_ids"].any()
    assert kw["timestep"].dtype == bf and kw["guidance"].dtype == torch.float32
    assert kw["hidden_states"].shape == (1, 15, 64) and kw["encoder_hidden_states"].shape == (
        1,
        7,
        4096,
    )
    assert kw["pooled_projections"].shape == (1, 768)

    kw = e2e._flux2_inputs("cpu", bf, height=3, width=5, text_len=7, cfg=e2e.FLUX2_DEV)
    # Flux2Pipeline._prepare_latent_ids / _prepare_text_ids: int64 (B, L, 4) over (t, h, w, l)
    want = torch.tensor([[[0, r, c, 0] for r in range(3) for c in range(5)]])
    assert kw["img_ids"].dtype == torch.int64 and torch.equal(kw["img_ids"], want)
    want = torch.tensor([[[0, 0, 0, i] for i in range(7)]])
    assert kw["txt_ids"].dtype == torch.int64 and torch.equal(kw["txt_ids"], want)
    assert kw["timestep"].dtype == bf and kw["guidance"].dtype == torch.float32
    assert kw["hidden_states"].shape == (1, 15, 128) and kw["encoder_hidden_states"].shape == (
        1,
        7,
        15360,
    )

    kw = e2e._wan_inputs("cpu", bf, frames=2, h=4, w=6, text_len=5)
    assert kw["hidden_states"].shape == (1, 16, 2, 4, 6) and kw["hidden_states"].dtype == bf
    assert kw["timestep"].dtype == torch.int64 and kw["encoder_hidden_states"].shape == (1, 5, 4096)


@pytest.mark.parametrize("name", list(e2e.E2E_MODELS))
def test_as_loaded_matches_from_pretrained(name, monkeypatch):
    """as_loaded(model, bf16) leaves every parameter and buffer in the dtype
    from_pretrained(torch_dtype=bf16) gives: _keep_in_fp32_modules and non-persistent
    buffers (SAME's rope inv_freq) stay fp32; and it does not warn."""
    from diffusers.models import modeling_utils

    spec = e2e.E2E_MODELS[name]
    warned = []
    monkeypatch.setattr(modeling_utils.logger, "warning", lambda msg, *a, **k: warned.append(msg))
    model = e2e.build_model(spec, 1, "cpu", torch.bfloat16, **spec.tiny_config)
    assert not warned, warned
    got = {n: t.dtype for n, t in [*model.named_parameters(), *model.named_buffers()]}
    keep = type(model)._keep_in_fp32_modules or []
    if keep:  # from_pretrained needs accelerate here; its rule, written out
        persistent = set(model.state_dict())
        for n, dt in got.items():
            fp32 = any(k in n.split(".") for k in keep) or n not in persistent
            assert dt == (torch.float32 if fp32 else torch.bfloat16), (n, dt)
        assert any(dt == torch.float32 for dt in got.values())
        return
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        ref = type(model).from_pretrained(d, torch_dtype=torch.bfloat16)
    want = {n: t.dtype for n, t in [*ref.named_parameters(), *ref.named_buffers()]}
    assert got == want
    if name == "same-l":
        assert got["decoder.blocks.0.transformers.0.attn.rope.inv_freq"] == torch.float32


@pytest.mark.slow
@torch.no_grad()
def test_same_oom_row_and_agreement(monkeypatch):
    """An out-of-memory in the unpatched decode (the dense (N, N) mask) becomes an OOM row
    and the patched decode still runs; where both ran they agree within rounding."""
    from diffusers.models.autoencoders import autoencoder_same as am

    spec = e2e.E2E_MODELS["same-l"]
    band_mask = am._band_mask

    def mask_or_oom(seq_len, *a, **k):
        if seq_len > 20:
            raise torch.cuda.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 4.04 GiB. GPU 0 ..."
            )
        return band_mask(seq_len, *a, **k)

    monkeypatch.setattr(am, "_band_mask", mask_or_oom)
    rows = []
    res = e2e.run_same(
        spec,
        DEVICE,
        lambda f: (f(), 3.0)[1],
        rows.append,
        dtypes=(torch.float32,),
        config=spec.tiny_config,
        sizes={"latents": (5, 9)},
        single_call_s=None,
    )
    assert [(r["impl"], r["ms"], r["note"]) for r in rows] == [
        ("unpatched", 3.0, None),
        ("patched", 3.0, None),
        ("unpatched", None, "OOM (tried to allocate 4.04 GiB)"),
        ("patched", 3.0, None),
    ]
    assert res[(torch.float32, 9)] == {"unpatched": None, "patched": 3.0}
    assert rows[1]["psnr"] > 58 and rows[3]["psnr"] is None
    line = e2e.format_row(rows[2])
    assert " OOM " in line and "27 tokens" in line and "window 3" in line, line

    # an unpatched first call slower than single_call_s is its row's one timed call (the
    # 3-minute dense path); the patched row always has its warm-up (Triton JIT) untimed
    rows = []
    e2e.run_same(
        spec,
        DEVICE,
        lambda f: (f(), 4.0)[1],
        rows.append,
        dtypes=(torch.float32,),
        config=spec.tiny_config,
        sizes={"latents": (5,)},
        single_call_s=0.0,
    )
    assert [r["note"] for r in rows] == ["one call (no warm-up)", None]
    assert rows[0]["ms"] > 0 and rows[0]["ms"] != 4.0 and rows[1]["ms"] == 4.0

    # the comparison itself, directly: same weights, same latents, decode unpatched / patched
    for dtype, tol in PATCHED_DECODE.items():
        model = e2e.build_model(spec, 0, DEVICE, dtype, **spec.tiny_config)
        lat = spec.inputs(DEVICE, dtype, latents=6, cfg=model.config)["latents"]
        monkeypatch.setattr(am, "_band_mask", band_mask)
        ref = model.decode(lat).sample
        ditfuse.patch(model)
        out = model.decode(lat).sample
        scale = ref.float().abs().max().item()
        assert scale > 0.1 and (out.float() - ref.float()).abs().max().item() <= tol * scale


def test_cli_parses_e2e_flags(capsys):
    from ditfuse.tools import bench

    if torch.cuda.is_available():
        pytest.skip("would run the GPU benchmark")
    assert (
        bench.main(["--e2e", "--models", "flux1-1024,same-l", "--no-compile", "--layers", "1"]) == 2
    )
    assert "no CUDA GPU" in capsys.readouterr().err
    assert bench.main(["--e2e", "--models", "flux1,same-l"]) == 2
    assert "unknown model(s) ['flux1']" in capsys.readouterr().err


def test_psnr():
    a = torch.ones(4)
    assert math.isinf(e2e.psnr(a, a))
    assert abs(e2e.psnr(a * 1.1, a) - 20.0) < 1e-4


def test_loop_timer_runs_steps_back_to_back():
    """loop_timer: warm-up calls (at least ``warmup``, for at least ``settle_ms``), then
    enough consecutive calls for min_ms, ms per call."""
    import time as _time

    calls = []

    def step():
        calls.append(1)
        _time.sleep(0.01)

    timer = e2e.loop_timer(min_ms=50, settle_ms=0, warmup=2, min_steps=3)
    assert timer.host_ms is None
    ms = timer(step)
    assert 9 <= ms < 30, ms
    assert 0 < timer.host_ms <= 2 * ms  # the first timed step's (here: all host time)
    assert 2 + 4 <= len(calls) <= 2 + 6, len(calls)
    calls.clear()
    timer = e2e.loop_timer(min_ms=50, settle_ms=60, warmup=2, min_steps=3)
    timer(step)
    assert 6 + 4 <= len(calls) <= 7 + 6, len(calls)  # the warm-up lasts ~60 ms


def test_fp8_patch_guard(monkeypatch):
    """A ditfuse whose patch() takes ``attention`` as a plain bool (``"fp8"`` would read as
    True and install the exact path) is refused with a clear error before anything runs; a
    patch that rejects the value surfaces as the same error kind."""

    def old_patch(obj, *, qk_norm_rope: bool = True, attention: bool = True):
        return None

    monkeypatch.setattr(ditfuse, "patch", old_patch)
    assert "attention='fp8') is not available" in e2e.fp8_patch_missing()
    with pytest.raises(RuntimeError, match=r"attention='fp8'\) is not available"):
        e2e.patch_fp8(torch.nn.Linear(2, 2))

    def rejecting_patch(obj, *, attention: "bool | str" = True):
        raise ValueError("attention must be True, False or 'fp8'")

    monkeypatch.setattr(ditfuse, "patch", rejecting_patch)
    assert e2e.fp8_patch_missing() is None
    with pytest.raises(RuntimeError, match="failed: attention must be"):
        e2e.patch_fp8(torch.nn.Linear(2, 2))


def test_cli_parses_e2e_fp8_flags(capsys):
    from ditfuse.tools import bench

    if torch.cuda.is_available():
        pytest.skip("would run the GPU benchmark")
    assert (
        bench.main(
            [
                "--e2e",
                "--fp8",
                "--models",
                "wan14b-720p,flux2-1024",
                "--layers",
                "1",
                "--steps",
                "2",
                "--rounds",
                "1",
            ]
        )
        == 2
    )
    assert "no CUDA GPU" in capsys.readouterr().err
    assert bench.main(["--e2e", "--fp8", "--models", "wan14b-1080p"]) == 2
    assert "unknown model(s) ['wan14b-1080p']" in capsys.readouterr().err
    assert set(e2e.FP8_MODELS) <= set(e2e.E2E_MODELS) and set(e2e.FP8_LAYERS) == set(e2e.FP8_MODELS)
    assert not e2e.E2E_MODELS["wan14b-720p"].in_all  # `--e2e` alone keeps its four-way models


@pytest.mark.slow
def test_run_e2e_fp8_rows_tiny(tmp_path, monkeypatch):
    """run_e2e(fp8=True): three rows a transformer (unpatched, patched, patched with the 8-bit
    patcher), the speed-up over the first, trajectories against unpatched eager; the VAE is
    skipped. The 8-bit patcher here is the exact patch, so its row carries the warning that
    no 8-bit attention ran."""
    monkeypatch.setattr(e2e, "patch_fp8", lambda m: ditfuse.patch(m))
    out, path = io.StringIO(), tmp_path / "e2e.csv"
    t = iter([2.0, 1.0, 0.5] * 2)
    failed = e2e.run_e2e(
        ["wan14b-720p", "same-l"],
        DEVICE,
        1,
        str(path),
        timer=lambda f: (f(), next(t))[1],
        slow_timer=None,
        compile_backend=None,
        steps=1,
        tiny=True,
        out=out,
        rounds=2,
        fp8=True,
    )
    log = out.getvalue()
    assert failed == 0, log
    assert "same-l: no 8-bit attention rows" in log
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert [r["impl"] for r in rows] == ["unpatched eager", "patched eager", "patched fp8 eager"], (
        log
    )
    assert [float(r["speedup"]) for r in rows] == [1.0, 2.0, 4.0]
    assert rows[0]["note"].startswith(
        "1-step trajectory vs unpatched eager bfloat16; rounds 2.00/2.00"
    )
    for r in rows:  # bf16: the exact patch is bitwise the unpatched model
        assert float(r["max_abs_diff"]) == 0.0 and math.isinf(float(r["psnr"])), r
    assert "WARNING: trajectory equal to the exact patch's" in rows[2]["note"]
    assert "WARNING" not in rows[1]["note"]


@pytest.mark.slow
def test_run_model_fp8_head_dim_64():
    """The real ``patch(attention="fp8")`` on tiny FLUX.2 with 64-wide heads (an 8-bit head
    width), under torch.compile (dynamo, eager backend): the 8-bit trajectory differs from the
    exact one by rounding only."""
    if e2e.fp8_patch_missing():
        pytest.skip(e2e.fp8_patch_missing())
    spec = e2e.E2E_MODELS["flux2-1024"]
    cfg = dict(
        spec.tiny_config,
        attention_head_dim=64,
        num_attention_heads=1,
        axes_dims_rope=(16, 16, 16, 16),
    )
    rows = []
    _, quality, reports = e2e.run_model(
        spec,
        DEVICE,
        torch.bfloat16,
        1,
        lambda f: (f(), 1.0)[1],
        rows.append,
        compile_backend="eager",
        steps=1,
        config=cfg,
        sizes=FEWER_TOKENS["flux2-1024"],
        rounds=1,
        fp8=True,
    )
    assert [r["impl"] for r in rows] == [
        "unpatched compile",
        "patched compile",
        "patched fp8 compile",
    ]
    assert quality["patched compile"]["max_abs_diff"] == 0.0
    fp8 = quality["patched fp8 compile"]
    assert 0 < fp8["max_abs_diff"] and 35 < fp8["psnr"] < float("inf"), fp8
    assert "WARNING" not in rows[2]["note"]


def test_device_weights_gib_counts_each_storage_once():
    m = torch.nn.Linear(4, 8, dtype=torch.bfloat16)
    m.register_buffer("tied", m.weight)  # the same storage again
    m.register_buffer("elsewhere", torch.empty(1000, device="meta"))
    assert e2e.device_weights_gib(m, "cpu") * 2**30 == (4 * 8 + 8) * 2
    assert e2e.device_weights_gib(m, "meta") * 2**30 == 1000 * 4
    from torch.testing._internal.two_tensor import TwoTensor  # a wrapper subclass

    w = torch.nn.Module()
    w.p = torch.nn.Parameter(TwoTensor(torch.ones(3), torch.ones(3)), requires_grad=False)
    assert e2e.device_weights_gib(w, "cpu") * 2**30 == 2 * 3 * 4


@pytest.mark.slow
def test_run_e2e_linear_fp8_ways_tiny(tmp_path, monkeypatch, fewer_tokens):
    """run_e2e(fp8=True, linear=True): a row for the unpatched model and each of the
    linear-FP8 ways, in order; a way that cannot run here (torchao, no FP8 device) is
    replaced by the exact patch so the flow is what runs on the GPU."""
    ways = [(label, fn) for label, fn in e2e.linear_fp8_ways()]
    assert [w[0] for w in ways] == [
        "patched",
        "patched fp8",
        "patched linear-fp8",
        "patched fp8 + linear-fp8",
        "torchao linear-fp8",
        "patched fp8 + torchao linear-fp8",
    ]
    ways[-2] = (ways[-2][0], lambda m: ditfuse.patch(m))
    ways[-1] = (ways[-1][0], lambda m: ditfuse.patch(m, attention="fp8"))
    monkeypatch.setattr(e2e, "linear_fp8_ways", lambda labels=None: ways)
    profiled = []

    def kernels(fn):  # a stand-in profile: the call runs, three kernels come back
        fn()
        profiled.append(fn)
        return [("nvjet_tst_x", 1000.0), ("_attention_8bit_ws_kernel", 2000.0), ("triton_p", 5.0)]

    out, path = io.StringIO(), tmp_path / "e2e.csv"
    # a row of an earlier call (another model, the same day's file) stays ahead of this call's
    earlier = dict.fromkeys(e2e.ROW_FIELDS, "")
    earlier.update(model="wan14b-720p", impl="unpatched compile", ms="1122.79")
    e2e.write_csv(str(path), [earlier])
    failed = e2e.run_e2e(
        ["wan14b-480p"],
        DEVICE,
        1,
        str(path),
        timer=lambda f: (f(), 1.0)[1],
        slow_timer=None,
        compile_backend=None,
        steps=1,
        tiny=True,
        out=out,
        rounds=1,
        fp8=True,
        linear=True,
        kernels=kernels,
    )
    log = out.getvalue()
    assert failed == 0, log
    assert len(profiled) == 1 + len(ways)  # once a way, after its timing
    split = "kernels of a call: attention 2.00, GEMM 1.00, other 0.01 ms (3.00)"
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert rows[0] == earlier
    rows = rows[1:]
    assert [r["impl"] for r in rows] == ["unpatched eager"] + [w[0] + " eager" for w in ways]
    assert all(r["note"].endswith(split) for r in rows), [r["note"] for r in rows]
    assert "patched linear-fp8 eager: ready in" in log
    assert "blocks.0.ffn.net.2: torch.bfloat16, exact" in log  # the patch report, printed


def test_ways_select_and_reject(capsys):
    from ditfuse.tools import bench

    picked = e2e.linear_fp8_ways(["torchao linear-fp8", "patched fp8 + linear-fp8"])
    assert [w[0] for w in picked] == ["patched fp8 + linear-fp8", "torchao linear-fp8"]
    with pytest.raises(ValueError, match=r"unknown \['bf16'\]"):
        e2e.linear_fp8_ways(["bf16"])
    argv = ["--e2e", "--fp8", "--models", "wan14b-480p", "--ways", "patched,bf16"]
    assert bench.main(argv + ["--linear-fp8"]) == 2
    assert "--ways: unknown ['bf16']" in capsys.readouterr().err
    assert bench.main(argv) == 2  # --linear-fp8 missing
    assert "--ways goes with --fp8 --linear-fp8" in capsys.readouterr().err
    assert bench.main(["--kernels"]) == 2  # a step's kernels: only with --e2e
    assert "--kernels goes with --e2e" in capsys.readouterr().err
    picked = e2e.linear_fp8_ways(["patched fp8 + torchao linear-fp8"])
    assert [w[0] for w in picked] == ["patched fp8 + torchao linear-fp8"]
