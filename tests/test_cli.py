"""The ``ditfuse`` command's surface, on the CPU and fast: ``--version`` / ``--help``, the
check's summary (a skipped gate is not a passed one), the AOT kernel names (whole words,
or cut at a word boundary with a hash) and the loader's error where no GPU is."""

import hashlib
import json
import re
import subprocess
import sys

import pytest
import torch

from ditfuse.aot.export import ENTRY_NAME_MAX, entry_name
from ditfuse.aot.loader import FORMAT, NoGPUError, load
from ditfuse.tools import check as c
from ditfuse.tools.cli import USAGE, main


def test_version(capsys):
    import triton

    from ditfuse._version import __version__

    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == f"ditfuse {__version__}"
    assert f"torch {torch.__version__}" in out and f"triton {triton.__version__}" in out
    from ditfuse.runtime.backend import describe_backend

    assert f"backend {describe_backend()}" in out


def test_version_as_a_command():
    r = subprocess.run(
        [sys.executable, "-m", "ditfuse", "--version"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0 and r.stdout.startswith("ditfuse "), r.stdout + r.stderr


def test_help_lists_the_commands(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for cmd in ("check", "bench", "inspect", "export", "--version"):
        assert cmd in out
    assert out.strip() == USAGE.strip()
    assert main([]) == 2  # no command: the usage, and a usage error
    assert main(["nonsense"]) == 2


def test_check_help(capsys):
    with pytest.raises(SystemExit) as e:
        c.main(["--help"])
    assert e.value.code == 0
    assert "SKIP" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------
# ditfuse check: PASS / FAIL / SKIP


def test_summary_counts_skipped_apart(capsys):
    g = c.Gates(total=4)
    g.add("qk accuracy", "wan14b bfloat16", True, "fine")
    g.add("qk accuracy", "wan14b float32", True, "fine")
    g.skip("patch (tiny model)", "diffusers", c.DIFFUSERS_MISSING)
    g.skip("patch (tiny VAE)", "diffusers", c.DIFFUSERS_MISSING)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[1/4] PASS") and out[2].startswith("[3/4] SKIP")
    assert g.ok and g.counts() == (2, 0, 2)
    assert g.summary() == (
        "2/2 gates passed, 2 skipped (diffusers is not installed: pip install 'ditfuse[diffusers]')"
    )
    assert [r[2] for r in g.rows] == ["PASS", "PASS", "SKIP", "SKIP"]
    assert "| SKIP " in g.table() and g.table().count("\n") == 5  # header, rule, 4 rows
    g.add("adaln accuracy", "x", False, "bad")  # past the planned total: the count grows
    assert capsys.readouterr().out.startswith("[5/5] FAIL")
    assert not g.ok
    assert g.summary().startswith("2/3 gates passed, 1 FAILED, 2 skipped (")


def test_patch_gates_without_diffusers_skip(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "diffusers", None)  # import diffusers -> ImportError
    g = c.Gates()
    c.patch_gates(g, "cpu")
    c.vae_patch_gates(g, "cpu")
    c.patch_fp8_gates(g, "cpu", True)
    assert [r[2] for r in g.rows] == ["SKIP", "SKIP", "SKIP"] and g.ok
    assert g.summary() == (
        "0/0 gates passed, 3 skipped (diffusers is not installed: pip install 'ditfuse[diffusers]')"
    )


def test_planned_gates():
    from importlib.util import find_spec

    from ditfuse.tools.shapes import QK_SHAPES
    from ditfuse.tools.tiny_models import CASES, VAE_CASES

    small = c.planned_gates(True, False)
    big = c.planned_gates(False, True)
    have = find_spec("diffusers") is not None
    patch = 2 * (len(CASES) + len(VAE_CASES)) if have else 2
    assert small > len(QK_SHAPES) * 3 + patch and big > len(QK_SHAPES) * 2 + patch


# ---------------------------------------------------------------------------------------
# AOT kernel names


def _whole_words(name: str, words: str) -> bool:
    return all(w in words.split("_") for w in name.split("_"))


def test_entry_name_whole():
    n = entry_name("qk_norm_rope", "h40d128_bf16_all_interleaved")
    assert n == "ditfuse_qk_norm_rope_h40d128_bf16_all_interleaved"
    assert entry_name("a.b", "x-y") == "ditfuse_a_b_x_y"  # an identifier
    from ditfuse.aot.ops import REGISTRY

    for e in REGISTRY.values():  # every registered default: whole
        full = f"ditfuse_{e.op}_{e.tag(e.defaults())}"
        assert entry_name(e.op, e.tag(e.defaults())) == full


@pytest.mark.parametrize(
    "tag",
    [
        "h40d128_bf16_all_interleaved_with_many_more_specialization_words",
        "h40d128_" + "x" * 80,
        "a_" * 40 + "end",
        "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb_cc_ddddddddddddd",
    ],
)
def test_entry_name_cut_at_a_word_boundary_with_a_hash(tag):
    full = re.sub(r"\W", "_", f"ditfuse_qk_norm_rope_{tag}")
    n = entry_name("qk_norm_rope", tag)
    assert len(n) <= ENTRY_NAME_MAX and re.fullmatch(r"[A-Za-z_]\w*", n)
    head, digest = n.rsplit("_", 1)
    assert digest == hashlib.sha256(full.encode()).hexdigest()[:8]
    assert full.startswith(head + "_")  # a prefix of whole words: cut where a "_" was
    assert _whole_words(head, full)
    # the longest such prefix
    nxt = full.find("_", len(head) + 1)
    assert nxt == -1 or nxt + 9 > ENTRY_NAME_MAX
    # two long names that share the kept words still differ
    assert entry_name("qk_norm_rope", tag + "_z") != n


# ---------------------------------------------------------------------------------------
# the loader without a GPU


def _fake_package(d, target="sm_90"):
    ptx, cubin = b"// ptx\n", b"\x7fELF"
    m = {
        "format": FORMAT,
        "op": "toy",
        "entry": "ditfuse_toy_d8_fp32",
        "target": target,
        "parameters": [
            {"name": "x", "kind": "input", "dtype": "fp32", "shape": ["B", "N", 8]},
            {"name": "N", "kind": "extra", "dtype": "int32", "value": "N"},
            {"name": "y", "kind": "output", "dtype": "fp32", "shape": ["B", "N", 8]},
        ],
        "symbols": {"B": "x.shape[0]", "N": "x.shape[1]"},
        "grid": ["N", "B", "1"],
        "block": [128, 1, 1],
        "shared_mem": 0,
        "files": {"ptx": "kernel.ptx", "cubin": "kernel.cubin"},
        "sha256": {
            "ptx": hashlib.sha256(ptx).hexdigest(),
            "cubin": hashlib.sha256(cubin).hexdigest(),
        },
    }
    (d / "kernel.ptx").write_bytes(ptx)
    (d / "kernel.cubin").write_bytes(cubin)
    (d / "manifest.json").write_text(json.dumps(m))
    return d


@pytest.mark.skipif(torch.cuda.is_available(), reason="the no-GPU message (this has a GPU)")
def test_loader_without_gpu_says_what_is_missing(tmp_path):
    k = load(_fake_package(tmp_path))
    x = torch.zeros(2, 5, 8)
    assert k.bind(x).grid == (5, 2, 1)  # binding needs no GPU
    with pytest.raises(NoGPUError) as e:
        k(x)
    msg = str(e.value)
    assert "no CUDA driver / GPU is available" in msg
    assert "compute capability 9.0 or newer" in msg and "CUDA driver" in msg
    assert "cuda-python" in msg and "pip install cuda-python" in msg
    assert "bind" in msg
    with pytest.raises(NoGPUError, match="no CUDA driver / GPU"):
        k.require_gpu()
    with pytest.raises(NoGPUError, match=r"capability 9\.0 with"):  # sm_90a: exactly 9.0
        d = tmp_path / "a"
        d.mkdir()
        load(_fake_package(d, "sm_90a"))(x)
