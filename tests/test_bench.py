"""The benchmark machinery on the CPU (a stub timer): every op, shape and impl produces a
row, and `ditfuse bench` without a GPU says so and exits non-zero."""

import sys

import pytest
import torch

from ditfuse.tools import bench
from ditfuse.tools.attention_inputs import FAMILIES
from ditfuse.tools.shapes import ADALN_SHAPES, QK_SHAPES


def test_bench_cases_run_on_cpu():
    rows = []

    def emit(op, shape, impl, dtype, us, gbps, pct):
        rows.append((op, shape, impl))
        assert us > 0 and gbps > 0 and pct > 0

    calls = {"n": 0}

    def timer(fn):  # runs the timed function once, as do_bench would, and reports 10 us
        fn()
        calls["n"] += 1
        return 10.0

    impls = {"copy", "eager", "ditfuse"}
    bench.bench_qk(
        QK_SHAPES["flux1-1024"].small(2),
        torch.float32,
        4000.0,
        emit,
        impls,
        device="cpu",
        timer=timer,
    )
    bench.bench_qk(
        QK_SHAPES["wan14b-480p"].small(2),
        torch.bfloat16,
        4000.0,
        emit,
        impls,
        device="cpu",
        timer=timer,
    )
    bench.bench_adaln(
        ADALN_SHAPES["wan5b-ti2v-704p"].small(2),
        torch.bfloat16,
        4000.0,
        emit,
        impls,
        device="cpu",
        timer=timer,
    )
    bench.bench_adaln(
        ADALN_SHAPES["flux1-1024"].small(2),
        torch.bfloat16,
        4000.0,
        emit,
        impls,
        device="cpu",
        timer=timer,
    )
    ops = {(o, i) for o, _, i in rows}
    for op in ("qk_norm_rope", "adaln_modulate", "gated_residual_adaln"):
        for impl in impls:
            assert (op, impl) in ops, (op, impl)
    # the quantizing prologue: 16-bit models only, no copy row (its floor is not a copy)
    assert {i for o, _, i in rows if o == "qk_norm_rope_int8"} == {"eager", "ditfuse"}
    assert {s for o, s, _ in rows if o == "qk_norm_rope_int8"} == {"wan14b-480p"}
    assert calls["n"] == len(rows)


def test_qk_int8_bytes_model():
    """The quantizing prologue's floor: Q / K read in 16 bits, written in 8, a 4-byte scale a
    head row, the table as the 16-bit op's."""
    from ditfuse.tools.workloads import qk_bytes

    sh = QK_SHAPES["wan14b-480p"]
    seen = {}
    bench.bench_qk_int8(
        sh.small(2),
        torch.bfloat16,
        4000.0,
        lambda op, shape, impl, dtype, us, gbps, pct: seen.update(gbps=gbps),
        {"ditfuse"},
        device="cpu",
        timer=lambda fn: 1e6,
    )
    small = sh.small(2)
    n = small.B * small.S * small.H * small.D
    want = qk_bytes(small) - 4 * n + 2 * n + 2 * small.B * small.S * small.H * 4
    assert abs(seen["gbps"] - want / 1e9) < 1e-12


def test_bench_without_gpu_exits_nonzero(capsys):
    if torch.cuda.is_available():
        return
    assert bench.main([]) != 0
    assert "no CUDA GPU" in capsys.readouterr().err


def test_group_norm_bench_case_on_cpu():
    from ditfuse.tools.shapes import GN_SHAPES

    rows = []

    def emit(op, shape, impl, dtype, us, gbps, pct):
        rows.append((op, impl))

    for name in ("flux-vae-mid-128", "wan-vae-mid-480p"):
        bench.bench_group_norm(
            GN_SHAPES[name].small(3),
            torch.bfloat16,
            4000.0,
            emit,
            {"copy", "eager", "ditfuse"},
            device="cpu",
            timer=lambda f: (f(), 5.0)[1],
        )
    assert {
        ("group_norm_silu", "ditfuse"),
        ("rms_norm_silu", "eager"),
        ("rms_norm_silu", "copy"),
    } <= set(rows)


def test_activation_bench_case_on_cpu():
    from ditfuse.tools.shapes import ACT_SHAPES

    rows = []

    def emit(op, shape, impl, dtype, us, gbps, pct):
        rows.append((op, shape, impl))

    for shape in ACT_SHAPES.values():
        bench.bench_activation(
            shape.small(2),
            torch.bfloat16,
            4000.0,
            emit,
            {"copy", "eager", "ditfuse"},
            device="cpu",
            timer=lambda f: (f(), 5.0)[1],
        )
    assert {
        ("swiglu", "flux2-1024", "ditfuse"),
        ("swiglu", "flux2-1024-ff", "eager"),
        ("gelu_tanh", "flux1-1024", "copy"),
        ("gelu_tanh", "flux1-1024", "ditfuse"),
    } <= set(rows)


def test_attention_bench_case_on_cpu():
    from ditfuse.tools.shapes import ATTN_SHAPES

    rows = []

    def emit(op, shape, impl, dtype, us, gbps, pct):
        rows.append((op, impl))

    for name in ("same-l-8704", "same-l-8704-plain"):
        bench.bench_attention(
            ATTN_SHAPES[name].small(20),
            torch.float32,
            4000.0,
            emit,
            {"copy", "eager", "ditfuse"},
            device="cpu",
            timer=lambda f: (f(), 5.0)[1],
        )
    assert rows.count(("sliding_window_attention", "ditfuse")) == 2
    assert ("sliding_window_attention", "eager") in rows


@pytest.mark.parametrize("n_in", [3, 5])
def test_attention_copy_moves_the_floors_bytes(n_in):
    """The attention rows' ``copy`` reads and writes as many bytes as the floor counts (n_in
    chunks read, the output written), not twice that."""
    proj = torch.randn(1, 7, n_in * 2 * 8)
    parts = [t.unflatten(-1, (2, 8)) for t in proj.chunk(n_in, dim=-1)]
    moved = 2 * sum(t.numel() * t.element_size() for t in bench.attention_copy_parts(parts))
    assert moved == (n_in + 1) * parts[0].numel() * parts[0].element_size()


def test_chart_one_panel_per_op(tmp_path):
    pytest.importorskip("matplotlib")
    from ditfuse.tools import bench

    rows = [
        dict(
            op=op,
            shape=s,
            impl=i,
            dtype="bf16",
            us=1.0,
            gbps=1.0,
            pct_copy=p,
            gpu="G",
            torch="t",
            triton="t",
            date="d",
        )
        for op in ("qk_norm_rope", "adaln_modulate")
        for s in ("a", "b")
        for i, p in (("copy", 260.0), ("ditfuse-graph", 60.0), ("compile", 30.0))
    ]
    path = tmp_path / "c.png"
    bench._chart(rows, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _fake_sage(monkeypatch, calls):
    """A ``sageattention`` module whose ``sageattn`` is SDPA on (B, S, H, D) tensors and,
    like the real one (smooth_k), subtracts the keys' mean from k in place."""
    import sys
    import types

    import torch.nn.functional as F

    def sageattn(q, k, v, tensor_layout="HND", is_causal=False):
        assert tensor_layout == "NHD" and not is_causal
        calls.append(k)
        k -= k.mean(dim=1, keepdim=True)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return o.transpose(1, 2)

    monkeypatch.setitem(sys.modules, "sageattention", types.SimpleNamespace(sageattn=sageattn))


def test_attention_fp8_bench_case_on_cpu(monkeypatch):
    """Every 8-bit attention impl gives a row at a small shape (the interpreter): backends
    the CPU refuses say so, the fastest SDPA backend is named, speed-ups and accuracy
    against float64 on both input kinds are filled where a method ran; SageAttention
    gets its own copy of k (it changes k in place)."""
    import math
    from dataclasses import replace

    from ditfuse.tools.shapes import FULL_ATTN_SHAPES

    rows, sage_k = {}, []
    _fake_sage(monkeypatch, sage_k)
    monkeypatch.setitem(sys.modules, "cudnn", None)  # the cudnn frontend: not installed

    def emit(op, shape, impl, dtype, us, gbps, pct, **extra):
        assert op == "attention_fp8" and math.isnan(gbps) and math.isnan(pct)
        rows[impl] = dict(us=us, **extra)

    us = {"n": 0}

    def timer(fn):
        fn()
        us["n"] += 1
        return 10.0 * us["n"]  # sdpa-flash 10, sage 20, ditfuse-fp8 30, prologue 40

    shape = replace(FULL_ATTN_SHAPES["flux2-1024"], S=24, H=2)
    bench.bench_attention_fp8(
        shape,
        torch.bfloat16,
        float("nan"),
        emit,
        set(bench.ATTN_FP8_IMPLS),
        device="cpu",
        timer=timer,
    )
    assert list(rows) == [
        "sdpa-cudnn",
        "sdpa-flash",
        "sdpa-efficient",
        "sdpa-best",
        "sage",
        "cudnn-fp8",
        "cudnn-fp8-e2e",
        "ditfuse-fp8",
        "ditfuse-fp8-prologue",
    ]
    for impl in ("sdpa-cudnn", "sdpa-efficient", "cudnn-fp8", "cudnn-fp8-e2e"):  # not here
        r = rows[impl]
        assert math.isnan(r["us"]), r
        assert r["note"].startswith("unavailable" if impl.startswith("cudnn") else "refused"), r
        assert all(math.isnan(r[c]) for c in bench.ACCURACY_COLUMNS), r
    assert rows["sdpa-best"]["note"] == "= sdpa-flash" and rows["sdpa-best"]["us"] == 10.0
    for impl, t in (
        ("sdpa-flash", 10.0),
        ("sage", 20.0),
        ("ditfuse-fp8", 30.0),
        ("ditfuse-fp8-prologue", 40.0),
    ):
        r = rows[impl]
        assert r["us"] == t and not r["note"], r
        assert r["tflops"] == pytest.approx(shape.flops / (t * 1e-6) / 1e12)
        assert r["x_best_sdpa"] == pytest.approx(10.0 / t) and r["x_sage"] == pytest.approx(
            20.0 / t
        )
        exact = not impl.startswith("ditfuse")  # 16-bit: one rounding of the output
        for kind in FAMILIES:
            cos, rel = r[f"cos_{kind}"], r[f"rel_l2_{kind}"]
            assert (cos > 1 - 1e-5 and rel < 2**-7) if exact else (cos > 0.99 and rel < 0.1), (
                impl,
                kind,
                r,
            )
    # sageattn saw a copy of k (one per input family), never the tensor the others read
    assert (
        len(sage_k) == len(FAMILIES) + 1 and sage_k[0] is sage_k[1] and sage_k[2] is not sage_k[0]
    )


def test_attention_fp8_unavailable_sage_and_failures_are_rows(monkeypatch):
    """No SageAttention: an "unavailable" row, no x_sage anywhere; a method that raises: a row
    with the error, the others still timed."""
    import math
    import sys
    from dataclasses import replace

    from ditfuse.tools.shapes import FULL_ATTN_SHAPES

    monkeypatch.setitem(sys.modules, "sageattention", None)  # import fails
    methods = bench.attention_fp8_methods()

    def broken(q, k, v):
        raise ValueError("no such kernel")

    monkeypatch.setattr(
        bench,
        "attention_fp8_methods",
        lambda: [m if m[0] != "ditfuse-fp8" else ("ditfuse-fp8", broken) for m in methods],
    )
    rows = {}
    bench.bench_attention_fp8(
        replace(FULL_ATTN_SHAPES["cogvideox-5b-480p"], S=16, H=1),
        torch.bfloat16,
        float("nan"),
        lambda *a, **kw: rows.setdefault(a[2], dict(us=a[4], **kw)),
        {"sdpa-flash", "sage", "ditfuse-fp8"},
        device="cpu",
        timer=lambda f: (f(), 5.0)[1],
    )
    assert list(rows) == ["sdpa-flash", "sdpa-best", "sage", "ditfuse-fp8"]
    assert rows["sage"]["note"].startswith("unavailable") and math.isnan(rows["sage"]["us"])
    assert rows["ditfuse-fp8"]["note"] == "error (randn): ValueError: no such kernel"
    assert rows["sdpa-flash"]["us"] == 5.0 and math.isnan(rows["sdpa-flash"]["x_sage"])


@pytest.mark.slow  # test_attention_fp8_bench_case_on_cpu covers the case in the default tier
def test_bench_smoke_attention_fp8_writes_the_csv(tmp_path, capsys):
    """``ditfuse bench --smoke --op attention-fp8`` on the CPU: the registry runner, the CSV
    (the 8-bit columns, the notes quoted) and the summary; fp32 is no 8-bit attention dtype."""
    import csv

    assert (
        bench.main(
            [
                "--smoke",
                "--op",
                "attention-fp8",
                "--shapes",
                "flux2-1024",
                "--dtypes",
                "bf16,fp32",
                "--impls",
                "sdpa-cudnn,sdpa-flash,ditfuse-fp8-prologue",
                "--out-dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "8-bit attention (time: CUDA graph replay" in out
    (path,) = tmp_path.glob("cpu-smoke-*.csv")
    with open(path) as f:
        got = list(csv.DictReader(f))
    assert list(got[0]) == bench.COLUMNS
    assert [(r["op"], r["shape"], r["dtype"], r["impl"]) for r in got] == [
        ("attention_fp8", "flux2-1024", "bf16", i)
        for i in ("sdpa-cudnn", "sdpa-flash", "sdpa-best", "ditfuse-fp8-prologue")
    ]
    assert got[0]["us"] == "nan" and got[0]["note"].startswith("refused")
    assert float(got[3]["us"]) > 0 and 0.99 < float(got[3]["cos_rmsnorm_rope"]) <= 1.0
    assert not list(tmp_path.glob("*.png"))  # no bytes model, no % of the copy ceiling: no chart


def test_csv_extra_columns(tmp_path):
    """Rows of ops without the 8-bit columns leave them empty; a note with a comma stays one
    field."""
    import csv
    import math

    base = dict(
        op="o",
        shape="s",
        impl="i",
        dtype="bf16",
        us=1.0,
        gbps=2.0,
        pct_copy=3.0,
        gpu="G",
        torch="t",
        triton="t",
        date="d",
    )
    rows = [
        base,
        dict(
            base,
            us=float("nan"),
            tflops=float("nan"),
            x_best_sdpa=1.5,
            cos_randn=0.123456789,
            note="refused: a, b",
        ),
    ]
    path = tmp_path / "r.csv"
    bench._write_csv(rows, str(path))
    with open(path) as f:
        got = list(csv.DictReader(f))
    assert got[0]["us"] == "1.00" and got[0]["tflops"] == "" and got[0]["note"] == ""
    assert got[1]["us"] == "nan" and math.isnan(float(got[1]["tflops"]))
    assert got[1]["x_best_sdpa"] == "1.500" and got[1]["cos_randn"] == "0.12345679"
    assert got[1]["note"] == "refused: a, b"


def test_cudnn_fp8_registered_and_unavailable_rows(monkeypatch):
    """cuDNN's FP8 attention is an 8-bit attention impl (pre-quantized and quantizing in the
    call); without the cudnn frontend each gives an "unavailable" row with the reason and
    no time, and the other rows still run."""
    import math
    from dataclasses import replace

    from ditfuse.tools.shapes import FULL_ATTN_SHAPES

    assert {"cudnn-fp8", "cudnn-fp8-e2e"} <= set(bench.ATTN_FP8_IMPLS)
    assert [i for i, _ in bench.attention_fp8_methods()] == list(bench.ATTN_FP8_IMPLS)
    monkeypatch.setitem(sys.modules, "cudnn", None)  # import fails
    rows = {}
    bench.bench_attention_fp8(
        replace(FULL_ATTN_SHAPES["flux2-1024"], S=16, H=1),
        torch.bfloat16,
        float("nan"),
        lambda *a, **kw: rows.setdefault(a[2], dict(us=a[4], **kw)),
        {"sdpa-flash", "cudnn-fp8", "cudnn-fp8-e2e"},
        device="cpu",
        timer=lambda f: (f(), 5.0)[1],
    )
    assert list(rows) == ["sdpa-flash", "sdpa-best", "cudnn-fp8", "cudnn-fp8-e2e"]
    for impl in ("cudnn-fp8", "cudnn-fp8-e2e"):
        r = rows[impl]
        assert r["note"].startswith("unavailable: ImportError") and math.isnan(r["us"]), r
        assert all(math.isnan(r[c]) for c in bench.ACCURACY_COLUMNS), r
    assert rows["sdpa-flash"]["us"] == 5.0 and rows["sdpa-flash"]["cos_local"] > 1 - 1e-5


def test_cudnn_fp8_graph_build_failure_is_unavailable(monkeypatch):
    """A cudnn frontend that imports but cannot build the FP8 graph: the build's exception is
    kept per layout and O dtype (raised again, not rebuilt, for the next input family); the
    (B, S, H, D) memory goes to cuDNN as (B, H, S, D) dims with the strides permuted."""
    import types

    calls = []

    def build(cudnn, dims, st, D, device, out_bf16):
        calls.append((tuple(dims), tuple(st), out_bf16))
        raise RuntimeError(f"not supported (bf16 O: {out_bf16})")

    monkeypatch.setitem(sys.modules, "cudnn", types.SimpleNamespace())
    monkeypatch.setattr(bench, "_build_cudnn_fp8_graph", build)
    monkeypatch.setattr(bench, "_CUDNN_FP8_GRAPHS", {})
    q8 = torch.zeros(2, 8, 3, 16, dtype=torch.float8_e4m3fn)
    for _ in range(2):  # the failure is kept: built once per layout and O dtype
        with pytest.raises(RuntimeError, match="bf16 O: True"):
            bench._cudnn_fp8_graph(q8, out_bf16=True)
    # (B, S, H, D) memory as (B, H, S, D) dims with the strides permuted
    assert calls == [((2, 3, 8, 16), (384, 16, 48, 1), True)]


def test_attention_input_families():
    """Every family: (B, S, H, D) bf16, the same draw for the same seed, another for another
    seed; the properties each family is built for."""
    from ditfuse.tools.attention_inputs import attention_inputs

    B, S, H, D = 1, 512, 2, 128
    for fam in FAMILIES:
        q, k, v = attention_inputs(fam, B, S, H, D, seed=3)
        assert q.shape == k.shape == v.shape == (B, S, H, D) and q.dtype == torch.bfloat16
        assert all(
            torch.equal(a, b) for a, b in zip((q, k, v), attention_inputs(fam, B, S, H, D, seed=3))
        )
        assert not torch.equal(q, attention_inputs(fam, B, S, H, D, seed=4)[0])
    q, k, v = (t.float() for t in attention_inputs("sharp", B, S, H, D))
    logits = torch.einsum("bshd,bthd->bhst", q, k) * D**-0.5
    assert 5.5 < logits.std().item() < 6.5
    q, k, v = (t.float() for t in attention_inputs("k_offset", B, S, H, D))
    assert k.mean(1).std().item() > 4 and q.mean(1).std().item() < 0.2
    q, k, v = (t.float() for t in attention_inputs("v_outlier", B, S, H, D))
    assert (v.abs().amax((0, 1, 2)) > 40).sum().item() == 4
    q, k, v = (t.float() for t in attention_inputs("local", B, S, H, D))
    near = torch.nn.functional.cosine_similarity(q[:, 1:], q[:, :-1], dim=-1).mean().item()
    assert near > 0.9
    q, k, v = (t.float() for t in attention_inputs("rmsnorm_rope", B, S, H, D))
    # RoPE keeps each pair's energy, which the log-normal channel weights make unequal
    pair = (q[..., 0::2].pow(2) + q[..., 1::2].pow(2)).mean((0, 1, 2))
    assert pair.max() > 3 * pair.min() and abs(q.pow(2).mean().item() - 1) < 1
    with pytest.raises(ValueError, match="family"):
        attention_inputs("rmsnorm", B, S, H, D)


def test_linear_fp8_residual_rows_asked_alone():
    """``--impls ditfuse-fp8-gelu-residual-after,ditfuse-fp8-gelu-residual`` at a GELU shape
    gives both rows without the GELU rows being asked for too."""
    from ditfuse.tools.bench_linear import LINEAR_SHAPES, bench_linear_fp8

    rows = []

    def emit(op, shape, impl, dtype, us, gbps, pct, **extra):
        rows.append(impl)

    impls = {"ditfuse-fp8-gelu-residual-after", "ditfuse-fp8-gelu-residual"}
    bench_linear_fp8(
        LINEAR_SHAPES["wan14b-480p-ffn-out"].small(4),
        torch.bfloat16,
        4000.0,
        emit,
        impls,
        device="cpu",
        timer=lambda fn: (fn(), 10.0)[1],
    )
    assert sorted(rows) == sorted(impls), rows
