"""The benchmark machinery on the CPU (a stub timer): every op, shape and impl produces a
row, and `ditfuse bench` without a GPU says so and exits non-zero."""
import pytest
import torch

from ditfuse.tools import bench
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
    bench.bench_qk(QK_SHAPES["flux1-1024"].small(2), torch.float32, 4000.0, emit, impls, device="cpu", timer=timer)
    bench.bench_qk(QK_SHAPES["wan14b-480p"].small(2), torch.bfloat16, 4000.0, emit, impls, device="cpu", timer=timer)
    bench.bench_adaln(ADALN_SHAPES["wan5b-ti2v-704p"].small(2), torch.bfloat16, 4000.0, emit, impls,
                      device="cpu", timer=timer)
    bench.bench_adaln(ADALN_SHAPES["flux1-1024"].small(2), torch.bfloat16, 4000.0, emit, impls,
                      device="cpu", timer=timer)
    ops = {(o, i) for o, _, i in rows}
    for op in ("qk_norm_rope", "adaln_modulate", "gated_residual_adaln"):
        for impl in impls:
            assert (op, impl) in ops, (op, impl)
    assert calls["n"] == len(rows)


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
        bench.bench_group_norm(GN_SHAPES[name].small(3), torch.bfloat16, 4000.0, emit,
                               {"copy", "eager", "ditfuse"}, device="cpu", timer=lambda f: (f(), 5.0)[1])
    assert {("group_norm_silu", "ditfuse"), ("rms_norm_silu", "eager"), ("rms_norm_silu", "copy")} <= set(rows)


def test_activation_bench_case_on_cpu():
    from ditfuse.tools.shapes import ACT_SHAPES

    rows = []

    def emit(op, shape, impl, dtype, us, gbps, pct):
        rows.append((op, shape, impl))

    for shape in ACT_SHAPES.values():
        bench.bench_activation(shape.small(2), torch.bfloat16, 4000.0, emit,
                               {"copy", "eager", "ditfuse"}, device="cpu", timer=lambda f: (f(), 5.0)[1])
    assert {("swiglu", "flux2-1024", "ditfuse"), ("swiglu", "flux2-1024-ff", "eager"),
            ("gelu_tanh", "flux1-1024", "copy"), ("gelu_tanh", "flux1-1024", "ditfuse")} <= set(rows)


def test_attention_bench_case_on_cpu():
    from ditfuse.tools.shapes import ATTN_SHAPES

    rows = []

    def emit(op, shape, impl, dtype, us, gbps, pct):
        rows.append((op, impl))

    for name in ("same-l-8704", "same-l-8704-plain"):
        bench.bench_attention(ATTN_SHAPES[name].small(20), torch.float32, 4000.0, emit,
                              {"copy", "eager", "ditfuse"}, device="cpu", timer=lambda f: (f(), 5.0)[1])
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

    rows = [dict(op=op, shape=s, impl=i, dtype="bf16", us=1.0, gbps=1.0, pct_copy=p, gpu="G",
                 torch="t", triton="t", date="d")
            for op in ("qk_norm_rope", "adaln_modulate") for s in ("a", "b")
            for i, p in (("copy", 260.0), ("ditfuse-graph", 60.0), ("compile", 30.0))]
    path = tmp_path / "c.png"
    bench._chart(rows, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
