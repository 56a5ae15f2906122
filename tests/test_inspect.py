"""Resource gate: no shipped QK-norm + RoPE specialization may spill on sm_90.

Every shipped specialization (``ditfuse.tools.inspect.SPECS``) is compiled for sm_90a
with the ptxas of the Triton wheel -- no GPU needed -- in a subprocess with
``TRITON_INTERPRET=0`` (the tests run the interpreter), and must have no spill
stores/loads, no stack frame and no LDL/STL (local memory) in its SASS.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ditfuse.aot.compile import missing_tools, wheel_tool_path
from ditfuse.tools.inspect import SPEC_NAMES

SRC = Path(__file__).resolve().parents[1] / "src"

pytestmark = pytest.mark.skipif(
    bool(missing_tools()),
    reason=f"the Triton wheel has no {', '.join(missing_tools())} "
    f"(looked in {wheel_tool_path('')}): cannot compile for sm_90 without a GPU",
)


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("inspect") / "report.json"
    env = dict(os.environ, TRITON_INTERPRET="0")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SRC)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    cmd = [sys.executable, "-m", "ditfuse.tools.inspect", "--quiet", "--json", str(out)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and out.exists(), (
        f"{' '.join(cmd)} failed ({r.returncode}):\n{(r.stdout + r.stderr)[-6000:]}"
    )
    return {row["name"]: row for row in json.loads(out.read_text())["kernels"]}


@pytest.mark.slow
def test_report_names_every_specialization(rows):
    assert list(rows) == SPEC_NAMES
    assert len(set(SPEC_NAMES)) == len(SPEC_NAMES)


@pytest.mark.slow
def test_registers_sane(rows):
    for name, r in rows.items():
        assert 0 < r["regs"] <= 255, (name, r["regs"])
        # ptxas -v (re-run with Triton's flags) describes the very cubin Triton built
        assert r["cubin_regs"] == r["regs"], (name, r["regs"], r["cubin_regs"])
        assert r["sass_instructions"] > 0, name
        assert r["num_warps"] in (1, 2, 4, 8, 16), (name, r["num_warps"])
        assert r["arch"] == "sm_90a" and r["enable_fp_fusion"] is False, name
        for v in r["variants"]:
            assert 0 < v["regs"] <= 255, (name, v)


@pytest.mark.slow
def test_packed_qkv_is_the_same_binary(rows):
    """Q/K slices of a fused QKV projection (in place) reuse the contiguous build (both with
    the half-width tables the patched Wan passes)."""
    assert rows["wan14b-packed"]["hash"] == rows["wan14b-half-table"]["hash"]


@pytest.mark.slow
def test_quantizing_builds_take_the_16_bit_kernel_and_form(rows):
    """The int8 prologue of 8-bit attention builds the kernel and form of its 16-bit call:
    Wan's across-heads norm the flat-row kernel's pair form (the pieces and warps of the
    16-bit build), FLUX.2's per-head norm the per-token kernel."""
    wan, wan16 = rows["wan14b-int8"], rows["wan14b-half-table"]
    assert wan["kernel"] == wan16["kernel"] == "_qk_norm_rope_flat_kernel"
    assert wan["constexprs"]["QUANT"] == 1 and wan["constexprs"]["PAIRS"]
    assert (wan["p0"], wan["p1"], wan["num_warps"]) == (
        wan16["p0"],
        wan16["p1"],
        wan16["num_warps"],
    )
    flux, flux16 = rows["flux2-int8"], rows["flux2"]
    assert flux["kernel"] == flux16["kernel"] == "_qk_norm_rope_kernel"
    assert flux["constexprs"]["QUANT"] == 1
    assert (flux["hg"], flux["num_warps"]) == (flux16["hg"], flux16["num_warps"])


@pytest.mark.slow
@pytest.mark.parametrize("name", SPEC_NAMES)
def test_no_spills_no_stack_no_local_memory(rows, name):
    r = rows[name]
    detail = (
        f"{name} ({r['model']}: {r['H']}x{r['D']} {r['dtype']}, {r['config']}; "
        f"HG={r['hg']}={r['p0']}+{r['p1']}, num_warps={r['num_warps']}): "
        f"{r['regs']} registers, spill stores {r['spill_stores']} B, spill loads "
        f"{r['spill_loads']} B, stack {r['stack']} B, LDL {r['ldl']}, STL {r['stl']}"
    )
    assert not r["violations"], f"{detail}\n  " + "\n  ".join(r["violations"])


def test_local_in_loops_counts_only_local_memory_inside_backward_branches():
    """The attention gate's loop test on hand-written SASS: a value kept in local memory
    across a loop (before and after it) is not in the loop; one reloaded each trip is; a
    branch to itself (the trap at a kernel's end) is no loop."""
    from ditfuse.aot.compile import local_in_loops

    def sass(body):
        return "\n".join(
            f"        /*{16 * i:04x}*/                   {op} ;" for i, op in enumerate(body)
        )

    kept = [
        "MOV R1, c[0x0][0x28]",
        "STL [R1], R4",
        "HMMA.1688.F32.TF32 R8, R12, R16, R8",
        "ISETP.GE.AND P0, PT, R2, R3, PT",
        "@!P0 BRA 0x20",
        "LDL.LU R4, [R1]",
        "EXIT",
        "BRA 0x70",
    ]
    assert local_in_loops(sass(kept)) == 0
    inside = list(kept)
    inside[3] = "@P1 LDL R5, [R1+0x4]"
    assert local_in_loops(sass(inside)) == 1
    forward_only = ["STL [R1], R4", "@P0 BRA 0x30", "LDL R4, [R1]", "EXIT"]
    assert local_in_loops(sass(forward_only)) == 0
    # an mbarrier wait's retry block after the end: entered by a forward branch, it returns
    # unconditionally to the next instruction -- no loop around the code in between
    stub = [
        "@!P1 BRA 0x60",
        "STL [R1], R4",
        "LDL.LU R4, [R1]",
        "EXIT",
        "NOP",
        "NOP",
        "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR4], R5",
        "@!P1 BRA 0x60",
        "BRA 0x10",
    ]
    assert local_in_loops(sass(stub)) == 0
    # the same return, conditional: a loop
    looping = list(stub)
    looping[8] = "@P2 BRA 0x10"
    assert local_in_loops(sass(looping)) == 2
