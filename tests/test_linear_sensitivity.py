"""The FP8-linear sensitivity tool on a tiny Wan model whose widths the FP8 path takes (the CPU
runs the FP8 GEMM through torch's reference): its classes, the exclusion that leaves one
class, the per-layer accuracy hooks, the rows."""

import math

import pytest
import torch

import ditfuse
from ditfuse.patching.linear_fp8 import DEFAULT_EXCLUDE
from ditfuse.tools import e2e
from ditfuse.tools import linear_sensitivity as S

WAN = e2e.E2E_MODELS["wan14b-480p"]
CONFIG = {
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "in_channels": 4,
    "out_channels": 4,
    "text_dim": 16,
    "ffn_dim": 64,
    "rope_max_seq_len": 32,
}
SIZES = {"frames": 1, "h": 8, "w": 8, "text_len": 6}


def _model(layers=2):
    m = e2e.build_model(WAN, layers, "cpu", torch.bfloat16, **CONFIG)
    kw = WAN.inputs("cpu", torch.bfloat16, cfg=m.config, **SIZES)
    return m, kw


def test_classes_and_only():
    m, _ = _model(3)
    classes = S.linear_classes(m, DEFAULT_EXCLUDE)
    assert classes["blocks: attn1.to_q/k/v"] == [
        f"blocks.{i}.attn1.to_{p}" for i in range(3) for p in "qkv"
    ]
    assert classes["blocks: ffn.net.2"] == [f"blocks.{i}.ffn.net.2" for i in range(3)]
    assert all(n.startswith("blocks.0.") for n in classes["first block"])
    assert all(n.startswith("blocks.2.") for n in classes["last block"])
    assert len(classes["first block"]) == len(classes["last block"]) == 10
    everything = {n for c, ns in classes.items() if ":" in c for n in ns}
    assert not any("norm" in n or "emb" in n for n in everything)
    report = ditfuse.patch(
        m,
        linear="fp8",
        linear_exclude=S.only(m, classes["blocks: ffn.net.0.proj"], DEFAULT_EXCLUDE),
    )
    fp8 = [line.split(":")[0].strip() for line in report.lines if ": fp8 (" in line]
    assert fp8 == [f"blocks.{i}.ffn.net.0.proj" for i in range(3)], report


def test_layer_accuracy_sees_every_fp8_linear():
    m, kw = _model()
    ditfuse.patch(m, linear="fp8")
    rows = S.layer_accuracy(m, kw)
    names = [r[0] for r in rows]
    assert "blocks.0.attn1.to_qkv" in names and "blocks.1.ffn.net.2 (GELU fused)" in names
    assert "blocks.0.ffn.net.0.proj" in names and "blocks.0.attn2.to_kv" in names
    assert len(names) == len(set(names)) == 2 * 7, names  # qkv, o, q, kv, o, ffn in, out
    for name, cos, rel in rows:
        # an FP8 GEMM: close to its 16-bit linear, but not equal (a hook on the wrong
        # tensors would give 1 / 0 or a far-off value)
        assert 0.99 < cos < 1.0 and 0.0 < rel < 0.15, (name, cos, rel)


@pytest.mark.slow
def test_run_sensitivity_rows():
    # 4 image and 3 text tokens, one step: every way still runs its trajectory and its step
    # (the interpreter's cost grows with the tokens, the rows' checks do not need them)
    rows = []
    sizes = dict(SIZES, h=4, w=4, text_len=3)
    S.run_sensitivity(WAN, "cpu", 2, rows.append, steps=1, config=CONFIG, sizes=sizes)
    ways = [r["name"] for r in rows if r["kind"] == "way"]
    assert ways[:3] == ["attention fp8", "linear fp8", "attention fp8 + linear fp8"]
    assert "linear fp8: blocks: attn1.to_q/k/v" in ways and "linear fp8: last block" in ways
    for r in rows:
        assert set(r) == set(S.ROW_FIELDS)
        assert math.isfinite(r["cos"]) and math.isfinite(r["rel_l2"])
        if r["kind"] == "way" and r["linears"]:  # FP8 linears ran: not bitwise
            assert r["psnr"] < float("inf") and r["rel_l2"] > 0, r
    assert sum(r["kind"] == "layer" for r in rows) == 14


@pytest.mark.parametrize(
    "argv", [["--models", "same-l"], ["--models", "wan14b-1080p"], ["--models", "wan14b-480p"]]
)
def test_cli(argv, capsys):
    from ditfuse.tools import bench

    if torch.cuda.is_available():
        pytest.skip("would run on the GPU")
    assert bench.main(["--e2e", "--linear-sensitivity", *argv]) == 2
    err = capsys.readouterr().err
    assert ("no CUDA GPU" in err) if argv[1] == "wan14b-480p" else ("not a transformer" in err)
