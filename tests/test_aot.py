"""AOT packages (``ditfuse export``, ``ditfuse.aot``), checked on the CPU.

Every example specialization is exported for real (Triton compiles in a
``TRITON_INTERPRET=0`` subprocess; the tests run the interpreter) and its package is
checked: the manifest against the PTX entry signature, the stripped parameters, ``.target``
and alignment, the resource numbers against the wheel's ptxas / cuobjdump, the arithmetic
against the JIT build, the C pair with gcc (and a run of its launcher against a stub
driver), the loader's argument packing (the package's own copy with neither Triton nor
ditfuse importable) and its no-GPU error, the TensorRT plugin against a stub ``tensorrt``.
Every refusal fires on a hand-written PTX. Loading through the driver, bitwise parity with
the JIT kernel, CUDA-graph replay and launch timing need a GPU (not here).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from ditfuse.aot import ptx as P
from ditfuse.aot.compile import missing_tools, wheel_tool_path
from ditfuse.aot.loader import eval_formula, load

SRC = Path(__file__).resolve().parents[1] / "src"

needs_tools = pytest.mark.skipif(
    bool(missing_tools()),
    reason=f"the Triton wheel has no {', '.join(missing_tools())} "
    f"(looked in {wheel_tool_path('')})",
)


def _env(interpret: str):
    env = dict(os.environ, TRITON_INTERPRET=interpret)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SRC)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    return env


# (name, op, target, options, c_header): every example specialization, plus variants
EXAMPLES = [
    ("adaln", "adaln_modulate", "sm_90", {}, True),
    ("gated", "gated_residual_adaln", "sm_90", {}, True),
    ("residual", "gated_residual", "sm_90", {}, False),
    ("qk_sm80", "qk_norm_rope", "sm_80", {}, False),
    ("adaln_sm89", "adaln_modulate", "sm_89", {}, False),
    (
        "qk_variant",
        "qk_norm_rope",
        "sm_90",
        dict(heads=12, dtype="fp16", norm_span="head", rope="half"),
        False,
    ),
]
# SAME-L: 24 heads x 64, window 17, fp32, differential; its default target (sm_80)
EXAMPLES.append(("swa", "sliding_window_attention", None, {}, True))
# the Hopper build of bf16 SAME-L (64-query tiles on wgmma; .target sm_90a kept): the one an
# H200 JIT-compiles itself (fp32 there runs 16-query tiles on mma.sync, sm_90 PTX)
EXAMPLES.append(("swa_sm90a", "sliding_window_attention", "sm_90a", dict(dtype="bf16"), False))

_DRIVER = """
import json, sys
from ditfuse.aot.export import export
for name, op, target, opts, ch in json.loads(sys.argv[1]):
    export(op, sys.argv[2] + "/" + name, target, c_header=ch, **opts)
"""


@pytest.fixture(scope="module")
def pkgs(tmp_path_factory):
    """Package dir per example: ``qk`` through the CLI with no option but ``-o`` (the
    interpreter is on in its environment, so it re-runs itself with TRITON_INTERPRET=0, as
    on a user's machine without a GPU), the others in one compiling subprocess."""
    if missing_tools():
        pytest.skip("no ptxas / cuobjdump in the Triton wheel")
    root = tmp_path_factory.mktemp("aot")
    r = subprocess.run(
        [sys.executable, "-m", "ditfuse", "export", "qk_norm_rope", "-o", str(root / "qk")],
        env=_env("1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ditfuse_qk_norm_rope" in r.stdout and "grid (B * N, 2, 1)" in r.stdout, r.stdout
    r = subprocess.run(
        [sys.executable, "-c", _DRIVER, json.dumps(EXAMPLES), str(root)],
        env=_env("0"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    return {name: root / name for name in ["qk"] + [e[0] for e in EXAMPLES]}


def _manifest(d):
    return json.loads((d / "manifest.json").read_text())


# ---------------------------------------------------------------------------------------
# the packages


@needs_tools
@pytest.mark.slow  # builds every example package (the pkgs fixture)
def test_every_example_is_packaged(pkgs):
    import hashlib

    for name, d in pkgs.items():
        m = _manifest(d)
        assert m["format"] == "ditfuse-aot/1", name
        for kind in ("ptx", "cubin"):
            data = (d / m["files"][kind]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == m["sha256"][kind], (name, kind)
        assert (d / "kernel.cubin").read_bytes()[:4] == b"\x7fELF", name
        assert m["triton_version"] == __import__("triton").__version__


@needs_tools
@pytest.mark.slow  # builds every example package (the pkgs fixture)
def test_wan_qk_default_manifest(pkgs):
    """``ditfuse export qk_norm_rope -o DIR``: Wan 14B, packed QKV in place, N the extra."""
    m = _manifest(pkgs["qk"])
    assert m["op"] == "qk_norm_rope" and m["target"] == "sm_90"
    assert [(p["name"], p["kind"], p["dtype"]) for p in m["parameters"]] == [
        ("qkv", "input", "bf16"),
        ("cos", "input", "fp32"),
        ("sin", "input", "fp32"),
        ("q_weight", "input", "bf16"),
        ("k_weight", "input", "bf16"),
        ("N", "extra", "int32"),
        ("qkv_out", "output", "bf16"),
    ]
    p = {q["name"]: q for q in m["parameters"]}
    assert p["qkv"]["shape"] == ["B", "N", 15360] and p["cos"]["shape"] == [1, "N", 1, 128]
    assert p["q_weight"]["shape"] == [5120] and p["qkv_out"]["aliases"] == "qkv"
    assert m["symbols"] == {"B": "qkv.shape[0]", "N": "qkv.shape[1]"}
    # the flat-row kernel (a norm across heads): Q and K in programs of their own
    assert m["kernel"] == "ditfuse.kernels.qk_flat:_qk_norm_rope_flat_kernel"
    assert m["grid"] == ["B * N", "2", "1"]
    assert m["block"] == [m["num_warps"] * 32, 1, 1]
    c = m["constexprs"]
    assert (c["D"], c["N0"], c["N1"], c["SPLIT_QK"], c["ROW_CONTIG"], c["ROPE"]["table_half"]) == (
        128,
        4096,
        1024,
        True,
        True,
        False,
    )
    b = m["bindings"]
    # every scalar a constant of the specialization; strides that grow with N from N
    assert b["S"] == "N" and b["NC"] == 5120 and b["q_eps"] == 1e-6 and b["q_n"] == 5120.0
    assert b["q_strides"][:2] == ["15360 * N", 15360]  # (b, s) strides of Q
    assert b["k_ptr"] == "qkv + 5120" and b["ko_ptr"] == "qkv_out + 5120"
    assert m["compile_options"]["enable_fp_fusion"] is False
    # the wrapper's signature is the runtime order and nothing else
    src = (pkgs["qk"] / "wrapper.py").read_text()
    assert re.search(rf"def {m['entry']}\(qkv, cos, sin, q_weight, k_weight, N, qkv_out\):", src)


@needs_tools
@pytest.mark.slow  # builds every example package (the pkgs fixture)
def test_adaln_manifests(pkgs):
    m = _manifest(pkgs["adaln"])
    assert [(p["name"], p["kind"]) for p in m["parameters"]] == [
        ("x", "input"),
        ("temb", "input"),
        ("N", "extra"),
        ("out", "output"),
    ]
    assert m["bindings"]["shift_ptr"] == "temb" and m["bindings"]["scale_ptr"] == "temb + 5120"
    assert m["bindings"]["strides"]["shift"][:2] == [6 * 5120, 0]  # (b, s) strides of a chunk
    g = _manifest(pkgs["gated"])
    assert [(p["name"], p["kind"]) for p in g["parameters"]] == [
        ("x", "input"),
        ("y", "input"),
        ("temb", "input"),
        ("N", "extra"),
        ("x_new", "output"),
        ("out", "output"),
    ]
    assert g["bindings"]["gate_ptr"] == "temb + 10240" and g["bindings"]["xnew_ptr"] == "x_new"
    assert m["grid"] == g["grid"] == ["N", "B", "1"]


@needs_tools
@pytest.mark.slow  # builds every example package (the pkgs fixture)
def test_manifest_matches_ptx_entry(pkgs):
    for name, d in pkgs.items():
        m = _manifest(d)
        text = (d / "kernel.ptx").read_text()
        e = P.entry(text)
        assert e.name == m["entry"], name
        assert len(e.params) == len(m["parameters"]), name
        kinds = [p["kind"] for p in m["parameters"]]
        assert kinds == sorted(kinds, key=["input", "extra", "output"].index), name  # TRT order
        for pp, mp in zip(e.params, m["parameters"]):
            assert pp.name == mp["ptx_param"], name
            if mp["kind"] == "extra":
                assert not pp.is_pointer and pp.type == "u32", (name, pp)
            else:
                assert pp.is_pointer and pp.type == "u64", (name, pp)


@needs_tools
@pytest.mark.slow  # builds every example package (the pkgs fixture)
def test_no_removed_parameter_is_read(pkgs):
    for name, d in pkgs.items():
        m = _manifest(d)
        text = (d / "kernel.ptx").read_text()
        n = len(m["parameters"])
        assert any("stripped 2 trailing" in r for r in m["rewrites"]), name
        # nothing names a parameter past the last declared one
        assert not re.search(rf"{m['entry']}_param_(?:{n}|{n + 1})\b", text), name
        declared = {p.name for p in P.entry(text).params}
        read = set(re.findall(r"ld\.param\.\w+\s+%\w+,\s*\[(\w+)\]", text))
        assert read and read <= declared, name


@needs_tools
@pytest.mark.slow  # builds every example package (the pkgs fixture)
def test_target_and_alignment_as_promised(pkgs):
    for name, d in pkgs.items():
        m = _manifest(d)
        text = (d / "kernel.ptx").read_text()
        assert P.target(text) == m["target"], name
        # an sm_90a package keeps its wgmma (it runs on sm_90a GPUs only: the H100 / H200)
        assert bool(P.arch_specific_instructions(text)) == m["target"].endswith("a"), name
        if m["target"] == "sm_90":
            assert m["triton_target"] == "sm_90a"
            assert ".target sm_90a -> sm_90 (no arch-specific instruction present)" in m["rewrites"]
        for p in P.entry(text).params:
            if p.is_pointer:
                assert p.align == 16, (name, p.decl)
        assert all(p.get("align", 16) == 16 for p in m["parameters"])
        if not m["compile_options"]["enable_fp_fusion"]:
            P.check_contraction_safe(text)


@needs_tools
@pytest.mark.slow  # builds every example package (the pkgs fixture)
def test_resources_come_from_ptxas(pkgs):
    """Re-assemble each kernel.ptx here with the wheel's ptxas -v (the package's flags) and
    read the cubin's resource usage with cuobjdump: both equal the manifest."""
    from ditfuse.aot.compile import tool_path

    for name, d in pkgs.items():
        m = _manifest(d)
        flags = m["ptxas"]["cmd"].split()[1:-3]  # "ptxas <flags> kernel.ptx -o kernel.cubin"
        out = d.parent / f"{name}.recheck.cubin"
        r = subprocess.run(
            [tool_path("ptxas"), *flags, str(d / "kernel.ptx"), "-o", str(out)],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr
        log = r.stdout + r.stderr
        assert f"Used {m['registers']} registers" in log, (name, log)
        assert (
            f"{m['stack']} bytes stack frame, {m['spill_stores']} bytes spill stores, "
            f"{m['spill_loads']} bytes spill loads"
        ) in log, (name, log)
        assert f"--gpu-name={m['target']}" in flags
        assert ("--fmad=false" in flags) == (not m["compile_options"]["enable_fp_fusion"])
        res = subprocess.run(
            [tool_path("cuobjdump"), "--dump-resource-usage", str(d / "kernel.cubin")],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert re.search(rf"Function {m['entry']}:\s*\n\s*REG:{m['registers']} ", res), (name, res)
        assert m["shared_mem"] <= P.SMEM_LIMIT
        if m["op"] != "sliding_window_attention":  # the memory-bound kernels: no local memory
            assert m["spill_stores"] == m["spill_loads"] == m["stack"] == 0, name
            assert m["local_memory_instructions"] == {"LDL": 0, "STL": 0}, name


@needs_tools
@pytest.mark.slow  # builds every example package (the pkgs fixture)
def test_same_arithmetic_as_the_jit_build(pkgs):
    for name, d in pkgs.items():
        m = _manifest(d)
        j = m["jit_reference"]
        hist = dict(sorted(P.float_op_histogram((d / "kernel.ptx").read_text()).items()))
        if m["op"] != "sliding_window_attention":
            assert j["float_ops_equal"] is True and hist == j["float_ops"], name
            continue
        # lambda = 1 is a constant in the package: the JIT build's per-row multiply
        # lam * (1 / l2) (one per query row a thread holds: 8 rows of an mma / wgmma tile
        # share a thread's pair, so BLOCK_M / num_warps / 8) folds away, exactly; nothing
        # else differs. No contraction anywhere (the kernel runs with fp fusion off, so which
        # product a fused multiply-add absorbs cannot depend on what is a constant): the
        # only fmas are the output's written ones, one an output element a thread
        diff = j["float_ops_diff"]
        assert set(diff) == {"mul.rn.f32"}, diff
        rows = m["constexprs"]["BLOCK_M"] // m["num_warps"] // 8
        assert diff["mul.rn.f32"][1] - diff["mul.rn.f32"][0] == rows, (diff, rows)
        per_thread = m["constexprs"]["BLOCK_M"] * m["constexprs"]["D"] // (32 * m["num_warps"])
        fmas = {k: v for k, v in hist.items() if k.startswith("fma")}
        assert fmas == {"fma.rn.f32": per_thread}, (fmas, per_thread)
        assert {k: hist.get(k, 0) for k in diff} == {k: v[0] for k, v in diff.items()}


@needs_tools
@pytest.mark.slow  # builds every example package (the pkgs fixture)
def test_variant_options(pkgs):
    m = _manifest(pkgs["qk_variant"])
    p = {q["name"]: q for q in m["parameters"]}
    assert p["qkv"]["dtype"] == "fp16" and p["qkv"]["shape"] == ["B", "N", 3 * 12 * 128]
    assert p["q_weight"]["shape"] == [128]
    assert m["constexprs"]["ROPE"]["interleaved"] is False
    assert m["constexprs"]["Q_NORM"]["span_all"] is False
    assert _manifest(pkgs["qk_sm80"])["target"] == "sm_80"
    assert _manifest(pkgs["adaln_sm89"])["target"] == "sm_89"


# ---------------------------------------------------------------------------------------
# the C pair

_STUB_MAIN = r"""
#include <stdio.h>
#include <string.h>
#include "kernel.h"
static const unsigned char *image;
CUresult cuModuleLoadData(CUmodule *m, const void *img) { image = img; *m = 0; return 0; }
CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{ (void)m; printf("entry %s\n", name); *f = (CUfunction)0x1; return 0; }
CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v)
{ (void)f; printf("attr %d %d\n", (int)a, v); return 0; }
CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int smem,
                        CUstream s, void **params, void **extra)
{
    (void)f; (void)s; (void)extra;
    printf("grid %u %u %u block %u %u %u smem %u\n", gx, gy, gz, bx, by, bz, smem);
%PRINT%
    return 0;
}
int main(void)
{
    CUmodule m; CUfunction f;
    if (%NAME%_load(&m, &f)) return 1;
    printf("elf %d\n", memcmp(image, "\177ELF", 4) == 0);
    return (int)%NAME%_launch(f, (CUstream)0, %ARGS%);
}
"""


@needs_tools
@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc")
@pytest.mark.parametrize("name", ["adaln", "gated", "swa"])
@pytest.mark.slow  # builds every example package (the pkgs fixture)
def test_c_header_pair(pkgs, name, tmp_path):
    d = pkgs[name]
    m = _manifest(d)
    assert m["files"]["header"] == "kernel.h" and m["files"]["source"] == "kernel.c"
    modes = [["-DDITFUSE_AOT_NO_CUDA_H"]]
    if Path("/usr/local/cuda/include/cuda.h").is_file():
        modes.append(["-I/usr/local/cuda/include"])
    for extra in modes:
        for cmd in (["gcc", "-std=c11"], ["gcc", "-x", "c++", "-std=c++14"]):
            r = subprocess.run(
                [*cmd, "-Wall", "-Wextra", "-Werror", "-fsyntax-only", *extra, str(d / "kernel.c")],
                capture_output=True,
                text=True,
            )
            assert r.returncode == 0, (cmd, extra, r.stderr)
    # run the launcher against a stub driver: grid, block, shared memory, argument order
    name_c = re.sub(r"\W", "_", m["entry"])
    vals, prints, B, N = [], [], 3, 1234
    for i, p in enumerate(m["parameters"]):
        if p["kind"] == "extra":
            vals.append(str(N))
            prints.append(f'    printf("{p["name"]} %d\\n", *(int32_t *)params[{i}]);')
        else:
            vals.append(f"(CUdeviceptr)0x{(i + 1) * 0x1000:x}")
            prints.append(f'    printf("{p["name"]} %llx\\n", *(CUdeviceptr *)params[{i}]);')
    vals.append(str(B))  # grid symbol B
    src = (
        _STUB_MAIN.replace("%PRINT%", "\n".join(prints))
        .replace("%NAME%", name_c)
        .replace("%ARGS%", ", ".join(vals))
    )
    (tmp_path / "main.c").write_text(src)
    exe = tmp_path / "launch"
    r = subprocess.run(
        [
            "gcc",
            "-std=c11",
            "-Wall",
            "-DDITFUSE_AOT_NO_CUDA_H",
            f"-I{d}",
            str(tmp_path / "main.c"),
            str(d / "kernel.c"),
            "-o",
            str(exe),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"entry {m['entry']}" and lines[1] == "elf 1"
    grid = [eval_formula(g, {"B": B, "N": N}) for g in m["grid"]]
    assert lines[2] == (
        f"grid {grid[0]} {grid[1]} {grid[2]} block {m['block'][0]} 1 1 smem {m['shared_mem']}"
    )
    want = [
        f"{p['name']} {N}" if p["kind"] == "extra" else f"{p['name']} {(i + 1) * 0x1000:x}"
        for i, p in enumerate(m["parameters"])
    ]
    assert lines[3:] == want


# ---------------------------------------------------------------------------------------
# the loader (no GPU here: binding only)


@needs_tools
@pytest.mark.slow  # builds every example package (the pkgs fixture)
def test_loader_binds_in_runtime_order(pkgs):
    k = load(pkgs["qk"])
    B, N = 2, 77
    qkv = torch.empty(B, N, 15360, dtype=torch.bfloat16, device="meta")
    cos = torch.empty(1, N, 1, 128, device="meta")
    sin = torch.empty(1, N, 1, 128, device="meta")
    w = torch.empty(5120, dtype=torch.bfloat16, device="meta")
    b = k.bind(qkv, cos, sin, w, w)
    assert b.grid == (B * N, 2, 1) and b.block == (k.manifest["block"][0], 1, 1)
    assert [(n, kind) for n, kind, _ in b.args] == [
        ("qkv", "ptr"),
        ("cos", "ptr"),
        ("sin", "ptr"),
        ("q_weight", "ptr"),
        ("k_weight", "ptr"),
        ("N", "i32"),
        ("qkv_out", "ptr"),
    ]
    assert b.args[5][2] == N and b.outputs[0] is qkv  # in place: qkv_out is qkv
    with pytest.raises(TypeError, match="dtype"):
        k.bind(qkv.float(), cos, sin, w, w)
    with pytest.raises(ValueError, match="contiguous"):
        k.bind(
            torch.empty(B, 15360, N, dtype=torch.bfloat16, device="meta").transpose(1, 2),
            cos,
            sin,
            w,
            w,
        )
    with pytest.raises(ValueError, match="shape"):
        k.bind(qkv, cos[:, :5], sin, w, w)
    # real (CPU) memory for the address checks
    qc = torch.empty(1, 4, 15360, dtype=torch.bfloat16)
    cc, wc = torch.empty(1, 4, 1, 128), torch.empty(5120, dtype=torch.bfloat16)
    assert k.bind(qc, cc, cc, wc, wc).args[-1][2] == qc.data_ptr()
    with pytest.raises(ValueError, match="same memory as qkv"):
        k.bind(qc, cc, cc, wc, wc, torch.empty_like(qc))
    odd = torch.empty(4 * 15360 + 1, dtype=torch.bfloat16)[1:].view(1, 4, 15360)
    with pytest.raises(ValueError, match="16-byte aligned"):
        k.bind(odd, cc, cc, wc, wc)
    g = load(pkgs["gated"])
    x = torch.empty(3, 5, 5120, dtype=torch.bfloat16, device="meta")
    temb = torch.empty(3, 6, 5120, device="meta")
    bg = g.bind(x, x, temb)
    assert bg.grid == (5, 3, 1) and len(bg.outputs) == 2  # outputs allocated
    if not torch.cuda.is_available():  # launching needs a GPU, its driver and cuda-python
        from ditfuse.aot.loader import NoGPUError

        with pytest.raises(NoGPUError, match=r"no CUDA driver / GPU.*cuda-python"):
            g(x, x, temb)


@needs_tools
@pytest.mark.slow  # builds every example package (the pkgs fixture)
def test_loader_has_no_triton(pkgs):
    """loader.py runs with Triton unimportable (loaded on its own, as a runtime would)."""
    code = f"""
import sys, importlib.util, torch
sys.modules["triton"] = None
spec = importlib.util.spec_from_file_location("aot_loader", {str(SRC / "ditfuse/aot/loader.py")!r})
mod = importlib.util.module_from_spec(spec); sys.modules["aot_loader"] = mod
spec.loader.exec_module(mod)
k = mod.load({str(pkgs["adaln"])!r})
x = torch.empty(1, 9, 5120, dtype=torch.bfloat16, device="meta")
b = k.bind(x, torch.empty(1, 6, 5120, device="meta"))
assert b.grid == (9, 1, 1), b.grid
assert "triton" not in {{m.split(".")[0] for m in sys.modules if sys.modules[m] is not None}}
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


@needs_tools
@pytest.mark.slow  # builds every example package (the pkgs fixture)
def test_package_loader_needs_neither_triton_nor_ditfuse(pkgs):
    """The package's own ditfuse_aot_loader.py, imported from the package directory with
    Triton and ditfuse unimportable: binds, and without a GPU a launch says what is
    missing."""
    d = pkgs["qk"]
    m = _manifest(d)
    assert m["files"]["loader"] == "ditfuse_aot_loader.py"
    copy = (d / "ditfuse_aot_loader.py").read_text()
    assert copy.endswith((SRC / "ditfuse/aot/loader.py").read_text())
    code = f"""
import sys, torch
sys.modules["triton"] = None
sys.modules["ditfuse"] = None
sys.path.insert(0, {str(d)!r})
from ditfuse_aot_loader import NoGPUError, load
k = load({str(d)!r})
qkv = torch.zeros(1, 4, 15360, dtype=torch.bfloat16)
t, w = torch.zeros(1, 4, 1, 128), torch.zeros(5120, dtype=torch.bfloat16)
assert k.bind(qkv, t, t, w, w).grid == (4, 2, 1)
if not torch.cuda.is_available():
    try:
        k(qkv, t, t, w, w)
        raise SystemExit("launched without a GPU")
    except NoGPUError as e:
        print(e)
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
    if not torch.cuda.is_available():
        assert "no CUDA driver / GPU is available" in r.stdout and "cuda-python" in r.stdout


@needs_tools
@pytest.mark.slow  # builds every example package (the pkgs fixture)
def test_package_says_what_each_file_is(pkgs):
    """README.txt and the manifest's file_roles: the loader to use, wrapper.py provenance
    only; the kernel name in whole words."""
    from ditfuse.aot.export import entry_name
    from ditfuse.aot.ops import get

    for name, d in pkgs.items():
        m = _manifest(d)
        assert set(m["file_roles"]) == set(m["files"].values()) | {"manifest.json"}, name
        for f in m["file_roles"]:
            assert (d / f).is_file(), (name, f)
        assert "provenance only" in m["file_roles"]["wrapper.py"]
        readme = (d / "README.txt").read_text()
        assert "from ditfuse_aot_loader import load" in readme and m["entry"] in readme
        assert "provenance only" in readme and "pip install cuda-python" in readme
        assert "Provenance only" in (d / "wrapper.py").read_text()
        e = get(m["op"])
        assert m["entry"] == entry_name(m["op"], e.tag(e.resolve(**m["options"]))), name
    assert _manifest(pkgs["qk"])["entry"].endswith("_all_interleaved")
    assert _manifest(pkgs["qk_variant"])["entry"].endswith("_head_half")


def test_formula():
    assert eval_formula("B * N", {"B": 3, "N": 7}) == 21
    assert eval_formula("cdiv(N, 64) + 1", {"N": 65}) == 3
    with pytest.raises(ValueError):
        eval_formula("__import__('os')", {})
    from ditfuse.aot.cheader import formula_to_c

    assert formula_to_c("cdiv(N, 64)") == "(((int64_t)N + INT64_C(64) - 1) / INT64_C(64))"


# ---------------------------------------------------------------------------------------
# the TensorRT plugin, against a stub tensorrt.plugin


class _Expr:
    """Stand-in for trtp.ShapeExpr: records the arithmetic it went through."""

    def __init__(self, v, s):
        self.v, self.s = v, s

    def _op(self, o, f, sym):
        ov, os_ = (o.v, o.s) if isinstance(o, _Expr) else (o, str(o))
        return _Expr(f(self.v, ov), f"({self.s} {sym} {os_})")

    def __mul__(self, o):
        return self._op(o, lambda a, b: a * b, "*")

    def __add__(self, o):
        return self._op(o, lambda a, b: a + b, "+")


def _stub_trt():
    trt = types.ModuleType("tensorrt")
    for n in ("bfloat16", "float16", "float32", "int32"):
        setattr(trt, n, n)
    trtp = types.ModuleType("tensorrt.plugin")
    reg = {}

    def deco(kind):
        def outer(pid):
            def inner(fn):
                reg.setdefault(pid, {})[kind] = fn
                return fn

            return inner

        return outer

    for kind in ("register", "autotune", "aot_impl", "impl"):
        setattr(trtp, kind, deco(kind))

    class TensorDesc:
        def __init__(self, shape, dtype):
            self.shape_expr, self.dtype, self.alias_of = shape, dtype, None

        def like(self):
            return TensorDesc(self.shape_expr, self.dtype)

        def aliased(self):
            d = self.like()
            d.alias_of = self
            return d

    class KernelLaunchParams:
        grid_x = grid_y = grid_z = block_x = shared_mem = None

    class SymIntExprs(list):
        def __init__(self, n):
            super().__init__([None] * n)

    trtp.TensorDesc, trtp.Tensor, trtp.KernelLaunchParams = TensorDesc, object, KernelLaunchParams
    trtp.SymIntExprs, trtp.SymExprs = SymIntExprs, list
    trtp.SymInt32 = lambda e: ("SymInt32", e.s if isinstance(e, _Expr) else e)
    trtp.AutoTuneCombination = lambda io: ("combo", io)
    trtp.cdiv = lambda a, b: _Expr(-(-a.v // b), f"cdiv({a.s}, {b})")
    trtp.ShapeExprs = types.SimpleNamespace(from_tuple=tuple)
    trt.plugin = trtp
    return trt, trtp, reg


@needs_tools
@pytest.mark.slow  # builds every example package (the pkgs fixture)
def test_trt_plugin_registration(pkgs, monkeypatch):
    import inspect
    import typing

    trt, trtp, reg = _stub_trt()
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setitem(sys.modules, "tensorrt.plugin", trtp)
    monkeypatch.delitem(sys.modules, "ditfuse.aot.trt_plugin", raising=False)
    from ditfuse.aot import trt_plugin

    pid = trt_plugin.register(pkgs["qk"])
    m = _manifest(pkgs["qk"])
    assert pid == "ditfuse::" + m["entry"][len("ditfuse_") :]
    fns = reg[pid]
    assert set(fns) == {"register", "autotune", "aot_impl", "impl"}
    sig = inspect.signature(fns["aot_impl"])
    assert list(sig.parameters) == [
        "qkv",
        "cos",
        "sin",
        "q_weight",
        "k_weight",
        "outputs",
        "tactic",
    ]
    hints = typing.get_type_hints(fns["register"])
    assert hints["qkv"] is trtp.TensorDesc
    B, N = _Expr(2, "B"), _Expr(100, "N")
    qkv = trtp.TensorDesc((B, N, 15360), "bfloat16")
    tab = trtp.TensorDesc((1, N, 1, 128), "float32")
    w = trtp.TensorDesc((5120,), "bfloat16")
    out = fns["register"](qkv, tab, tab, w, w)
    assert out.alias_of is qkv  # in place
    assert fns["autotune"](qkv, tab, tab, w, w, ()) == [
        ("combo", "BF16, FP32, FP32, BF16, BF16, BF16")
    ]
    name, ptx, launch, extras = fns["aot_impl"](qkv, tab, tab, w, w, (out,), 0)
    assert name == m["entry"] and ptx == (pkgs["qk"] / "kernel.ptx").read_text()
    assert launch.grid_x.s == "(B * N)" and launch.grid_x.v == 200
    assert (launch.grid_y, launch.grid_z) == (2, 1)  # Q and K programs
    assert launch.block_x == m["block"][0] and launch.shared_mem == m["shared_mem"]
    assert list(extras) == [("SymInt32", "N")]

    pid2 = trt_plugin.register(pkgs["gated"])
    x = trtp.TensorDesc((B, N, 5120), "bfloat16")
    outs = reg[pid2]["register"](x, x, trtp.TensorDesc((B, 6, 5120), "float32"))
    assert len(outs) == 2 and all(o.alias_of is None and o.shape_expr == x.shape_expr for o in outs)


# ---------------------------------------------------------------------------------------
# the refusals, each on a hand-written PTX

_PTX = """//
.version 8.7
.target {target}
.address_size 64

.extern .shared .align 16 .b8 global_smem[];
{decls}
.visible .entry k(
	.param .u64 .ptr .global .align 1 k_param_0,
	.param .u32 k_param_1,
	.param .u64 .ptr .global .align 1 k_param_2,
	.param .u64 .ptr .global .align 1 k_param_3,
	.param .u64 .ptr .global .align 1 k_param_4
)
.reqntid 128
{{
	.reg .b32 	%r<4>;
	.reg .f32 	%f<4>;
	.reg .b64 	%rd<6>;
	ld.param.b64 	%rd1, [k_param_0];
	ld.param.b32 	%r1, [k_param_1];
	ld.param.b64 	%rd2, [k_param_2];
{body}
	ld.global.b32 	%f1, [%rd1];
	mul.rn.f32 	%f2, %f1, %f1;
	add.rn.f32 	%f3, %f2, %f1;
	st.global.b32 	[%rd2], %f3;
	ret;
}}
"""


def _ptx(target="sm_90a", body="", decls=""):
    return _PTX.format(target=target, body=body, decls=decls)


def test_strip_unread_scratch_params():
    text, gone = P.strip_unread_params(_ptx(), 3)
    assert gone == ["k_param_3", "k_param_4"]
    assert [p.name for p in P.entry(text).params] == ["k_param_0", "k_param_1", "k_param_2"]


@pytest.mark.parametrize(
    "use", ["\tld.param.b64 \t%rd3, [k_param_4];", "\tmov.b64 \t%rd3, k_param_3;"]
)
def test_refuses_to_strip_a_read_scratch_param(use):
    with pytest.raises(P.AotRefusal, match=r"scratch-param-read.*reads it") as e:
        P.strip_unread_params(_ptx(body=use), 3)
    assert e.value.rule == "scratch-param-read"


def test_refuses_fewer_params_than_the_runtime_passes():
    with pytest.raises(P.AotRefusal, match="signature"):
        P.strip_unread_params(_ptx(), 6)


def test_retarget_plain_and_refuse_arch_specific():
    text, note = P.retarget(_ptx(), "sm_90")
    assert P.target(text) == "sm_90" and "sm_90a -> sm_90" in note
    assert P.retarget(_ptx(target="sm_80"), "sm_80") == (_ptx(target="sm_80"), None)
    for ins in (
        "\twgmma.fence.sync.aligned;",
        "\twgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%f1}, %rd1, %rd2, 1, 1, 1, 1, 1;",
        "\tsetmaxnreg.inc.sync.aligned.u32 240;",
    ):
        with pytest.raises(P.AotRefusal, match=r"arch-specific.*sm_90a") as e:
            P.retarget(_ptx(body=ins), "sm_90")
        assert e.value.rule == "arch-specific" and "--target sm_90a" in str(e.value)
    with pytest.raises(P.AotRefusal, match="target"):
        P.retarget(_ptx(target="sm_80"), "sm_90")


def test_pointer_alignment_fixed():
    text, n = P.fix_pointer_alignment(_ptx(), 16)
    assert n == 4
    params = P.entry(text).params
    assert [p.align for p in params if p.is_pointer] == [16] * 4
    assert [p.align for p in params if not p.is_pointer] == [None]
    # only the entry signature changes
    assert text.replace(".align 16 k_param", ".align 1 k_param") == _ptx()


def test_refuses_large_shared_memory():
    big = ".shared .align 16 .b8 tile[40960];\n.shared .align 4 .f32 red[4096];"
    with pytest.raises(P.AotRefusal, match=r"shared-memory.*57344 B.*--allow-large-smem") as e:
        P.check_shared_memory(_ptx(decls=big), 0, allow_large=False)
    assert e.value.rule == "shared-memory"
    assert P.check_shared_memory(_ptx(decls=big), 0, allow_large=True)["total"] == 57344
    with pytest.raises(P.AotRefusal, match="shared-memory"):
        P.check_shared_memory(_ptx(), 48 * 1024 + 1, allow_large=False)  # dynamic
    assert P.check_shared_memory(_ptx(), 48 * 1024, allow_large=False)["total"] == 48 * 1024


def test_refuses_tensor_core_op_without_mma():
    with pytest.raises(P.AotRefusal, match=r"no-tensor-cores.*fell back to FMA") as e:
        P.check_tensor_cores(_ptx(), "sliding_window_attention")
    assert e.value.rule == "no-tensor-cores"
    mma = (
        "\tmma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%f1, %f2, %f3, %f3}, "
        "{%r1, %r2, %r3, %r3}, {%r1, %r2}, {%f1, %f2, %f3, %f3};"
    )
    assert P.check_tensor_cores(_ptx(body=mma), "x") == {"mma": 1}
    wg = "\twgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 {%r1}, %rd1, %rd2, 0, 1, 1;"
    assert P.check_tensor_cores(_ptx(body=wg), "x") == {"wgmma": 1}


@needs_tools
@pytest.mark.slow  # builds every example package (the pkgs fixture)
def test_attention_package_and_its_mma_refusal(pkgs):
    """SAME-L's differential attention in fp32: packaged for sm_80 (mma.sync, which Hopper
    runs) with the JIT call's 16-query one-warp tiles and its two pipeline stages (20 KB of
    shared memory, under 48 KB); the same PTX with its mma instructions removed is refused
    as a tensor-core op without them."""
    from ditfuse.aot import REGISTRY
    from ditfuse.aot.export import package_ptx

    entry = REGISTRY["sliding_window_attention"]
    d = pkgs["swa"]
    m = _manifest(d)
    assert entry.tensor_cores and m["target"] == "sm_80"
    assert [(p["name"], p["kind"], p.get("shape")) for p in m["parameters"]] == [
        ("q", "input", ["B", "N", 48, 64]),
        ("k", "input", ["B", "N", 48, 64]),
        ("v", "input", ["B", "N", 24, 64]),
        ("N", "extra", None),
        ("out", "output", ["B", "N", 24, 64]),
    ]
    # token-major (the operands are (B, N, H, D)): every (batch, head) of a query tile first
    assert m["constexprs"]["TOKEN_MAJOR"] is True
    # a program stores 30 of its 32 queries (their band spans 4 key tiles of 16, not 5)
    assert m["constexprs"]["STEP_M"] == 30
    assert m["grid"] == ["B * 24", "cdiv(N, 30)", "1"]
    assert m["constexprs"]["DIFF"] is True and m["bindings"]["LEFT"] == 17
    # the TensorRT contract multiplies fp32 in tf32 whatever the exporting process's
    # torch.get_float32_matmul_precision() (PyTorch's default "highest" would be tf32x3)
    assert m["constexprs"]["PREC"] == "tf32" and "tf32" in m["contract"]
    assert m["bindings"]["q2_ptr"] == "q + 1536" and m["bindings"]["k2_ptr"] == "k + 1536"
    # two warps of mma.sync, 16 query rows each (P @ V in two column halves)
    assert m["constexprs"]["BLOCK_M"] == 32 and m["compile_options"]["num_warps"] == 2
    assert m["constexprs"]["SPLIT_PV"] is True
    assert m["compile_options"]["num_stages"] == m["compile_options"]["jit_num_stages"] == 3
    assert m["shared_mem"] <= P.SMEM_LIMIT
    text = (d / "kernel.ptx").read_text()
    assert P.check_tensor_cores(text, entry.op)["mma"] > 0
    assert any(r.startswith("tensor cores:") for r in m["rewrites"])
    no_mma = "\n".join(ln for ln in text.splitlines() if not re.match(r"\s*mma\.", ln))
    kw = dict(
        op=entry.op,
        metadata={"shared": m["shared_mem"]},
        allow_large_smem=False,
        no_contraction=False,
        param_kinds=[p["kind"] for p in m["parameters"]],
    )
    with pytest.raises(P.AotRefusal, match="no-tensor-cores"):
        package_ptx(
            no_mma, m["entry"], len(m["parameters"]), "sm_80", tensor_cores=entry.tensor_cores, **kw
        )
    package_ptx(
        text, m["entry"], len(m["parameters"]), "sm_80", tensor_cores=entry.tensor_cores, **kw
    )
    k = load(d)
    q = torch.empty(2, 100, 48, 64, device="meta")
    b = k.bind(q, q, torch.empty(2, 100, 24, 64, device="meta"))
    assert b.grid == (2 * 24, 4, 1) and b.args[3] == ("N", "i32", 100)  # cdiv(100, 30)


@needs_tools
def test_attention_for_sm90_is_refused_with_its_reason(tmp_path):
    """In bf16 its sm_90 PTX uses wgmma (64-query tiles): .target sm_90a cannot become
    sm_90."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "ditfuse",
            "export",
            "sliding_window_attention",
            "--dtype",
            "bf16",
            "--target",
            "sm_90",
            "-o",
            str(tmp_path / "x"),
        ],
        env=_env("0"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 3, r.stdout + r.stderr
    assert "refused [arch-specific]" in r.stderr and "wgmma" in r.stderr
    assert not (tmp_path / "x").exists()


def test_package_pipeline_refuses_tensor_core_op_without_mma():
    """The exporter's whole PTX pipeline, for an op flagged as a tensor-core kernel (the
    sliding-window attention's entry sets tensor_cores=True)."""
    from ditfuse.aot.export import package_ptx

    kw = dict(
        op="sliding_window_attention",
        metadata={"shared": 0},
        allow_large_smem=False,
        no_contraction=True,
        param_kinds=["input", "extra", "output"],
    )
    with pytest.raises(P.AotRefusal, match="no-tensor-cores"):
        package_ptx(_ptx(), "k", 3, "sm_90", tensor_cores=True, **kw)
    text, notes, smem = package_ptx(_ptx(), "k", 3, "sm_90", tensor_cores=False, **kw)
    assert P.target(text) == "sm_90" and len(P.entry(text).params) == 3
    with pytest.raises(P.AotRefusal, match="scratch-size"):
        package_ptx(
            _ptx(),
            "k",
            3,
            "sm_90",
            tensor_cores=False,
            **{**kw, "metadata": {"shared": 0, "global_scratch_size": 64}},
        )
    with pytest.raises(P.AotRefusal, match="signature"):  # a pointer where an extra goes
        package_ptx(
            _ptx(),
            "k",
            3,
            "sm_90",
            tensor_cores=False,
            **{**kw, "param_kinds": ["input", "input", "output"]},
        )


def test_refuses_uncontracted_float_ops():
    with pytest.raises(P.AotRefusal, match="fp-contraction"):
        P.check_contraction_safe(_ptx(body="\tmul.f32 \t%f2, %f1, %f1;"))
    P.check_contraction_safe(_ptx(body="\tfma.rn.f32 \t%f2, %f1, %f1, %f1;"))


def test_capture_refusals():
    """bind() refuses launches that change with the shape or scalars not affine in N."""
    from ditfuse.aot.export import Capture, bind
    from ditfuse.aot.ops import OpExport, TensorSpec

    entry = OpExport(
        op="toy",
        summary="",
        kernel="x:y",
        options=(),
        tensors=lambda o: [
            TensorSpec("x", "input", ("B", "N"), "fp32"),
            TensorSpec("y", "output", ("B", "N"), "fp32"),
        ],
        call=None,
        writes={"y_ptr": "y"},
        grid=None,
        tag=None,
    )
    kernel = types.SimpleNamespace(arg_names=["x_ptr", "y_ptr", "n", "stride", "BLOCK"])

    def caps(f, block=lambda B, N: 64):
        out = []
        for B in (2, 3):
            for N in (100, 101, 137):
                x = torch.empty(B, N, device="meta")
                y = torch.empty(B, N, device="meta")
                out.append(
                    Capture(
                        B,
                        N,
                        {"x": x, "y": y},
                        (B * N, 1, 1),
                        (x, y, N, f(B, N)),
                        {"BLOCK": block(B, N), "num_warps": 4},
                    )
                )
        return out

    b, cst, opts = bind(entry, None, caps(lambda B, N: 4 * N + 1), kernel)
    assert [x.describe() for x in b] == ["x", "y", "N", "4 * N + 1"]
    assert cst == {"BLOCK": 64} and opts == {"num_warps": 4}
    with pytest.raises(P.AotRefusal, match="non-affine-scalar"):
        bind(entry, None, caps(lambda B, N: -(-N // 64)), kernel)
    with pytest.raises(P.AotRefusal, match="non-affine-scalar"):
        bind(entry, None, caps(lambda B, N: B * N), kernel)
    with pytest.raises(P.AotRefusal, match="shape-dependent-launch"):
        bind(entry, None, caps(lambda B, N: 1, block=lambda B, N: 64 if N < 120 else 128), kernel)


def test_tuple_parameters_bind_item_by_item():
    """A tensor's strides as one tuple (positional or by keyword) bind item by item, and a
    NamedTuple of flags is a constexpr the wrapper writes as a module constant."""
    import dataclasses
    from typing import NamedTuple

    from ditfuse.aot.export import Capture, bind, jsonable, wrapper_source
    from ditfuse.aot.ops import OpExport, TensorSpec

    class Flags(NamedTuple):
        on: bool
        kind: int

    entry = OpExport(
        op="toy",
        summary="",
        kernel="x:y",
        options=(),
        tensors=lambda o: [
            TensorSpec("x", "input", ("B", "N", 8), "fp32"),
            TensorSpec("y", "output", ("B", "N", 8), "fp32"),
        ],
        call=None,
        writes={"y_ptr": "y"},
        grid=None,
        tag=None,
    )
    names = ["x_ptr", "y_ptr", "n", "x_strides", "y_strides", "BLOCK", "FLAGS"]
    params = [types.SimpleNamespace(name=n, is_constexpr=n.isupper()) for n in names]
    kernel = types.SimpleNamespace(arg_names=names, params=params)
    caps = []
    for B in (2, 3):
        for N in (100, 101, 137):
            x = torch.empty(B, N, 8, device="meta")
            y = torch.empty(B, N, 8, device="meta")
            caps.append(
                Capture(
                    B,
                    N,
                    {"x": x, "y": y},
                    (B * N, 1, 1),
                    (x, y, N, x.stride()),
                    {"y_strides": y.stride(), "BLOCK": 64, "FLAGS": Flags(True, 3), "num_warps": 4},
                )
            )
    b, cst, opts = bind(entry, None, caps, kernel)
    assert [x.describe() for x in b] == ["x", "y", "N", ["8 * N", 8, 1], ["8 * N", 8, 1]]
    assert cst == {"BLOCK": 64, "FLAGS": Flags(True, 3)} and opts == {"num_warps": 4}
    assert jsonable(cst["FLAGS"]) == {"on": True, "kind": 3}
    src = wrapper_source(entry, "w", [], b, cst)
    assert "x_strides=(N.to(tl.int64) * 8, 8, 1)" in src
    assert "_FLAGS = tl.constexpr(Flags(on=True, kind=3))" in src and "FLAGS=_FLAGS" in src
    with pytest.raises(P.AotRefusal, match="shape-dependent-launch"):
        bind(
            entry,
            None,
            caps[:3]
            + [dataclasses.replace(caps[3], kwargs={**caps[3].kwargs, "FLAGS": Flags(False, 3)})],
            kernel,
        )


def test_cli_usage():
    from ditfuse.aot.cli import main

    assert main(["--list"]) == 0
    with pytest.raises(SystemExit):
        main(["qk_norm_rope", "-o", "x", "--target", "sm_75"])
    from ditfuse.tools.cli import USAGE

    assert "export" in USAGE


def test_registry_has_the_examples():
    from ditfuse.aot import REGISTRY

    assert {"qk_norm_rope", "adaln_modulate", "gated_residual_adaln"} <= set(REGISTRY)
    try:
        import ditfuse.ops.attention as attention  # noqa: F401
    except ImportError:
        pytest.skip(
            "ditfuse.attention not written yet: no sliding_window_attention export "
            "(the entry template is in ditfuse/aot/ops.py)"
        )
    assert (
        "sliding_window_attention" in REGISTRY and REGISTRY["sliding_window_attention"].tensor_cores
    )


# ---------------------------------------------------------------------------------------
# on a GPU: the package launched through the driver API against the JIT kernel


def _random_inputs(m, B, N, device, seed=0):
    """Runtime tensors for a package (inputs random, outputs poisoned / aliased)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    dts = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    t = {}
    for p in m["parameters"]:
        if p["kind"] == "extra":
            continue
        if p.get("aliases"):
            t[p["name"]] = t[p["aliases"]]
            continue
        shape = [B if d == "B" else N if d == "N" else d for d in p["shape"]]
        if p["kind"] == "output":
            x = torch.full(shape, float("nan"))
        elif p["name"] in ("cos", "sin"):
            ang = torch.rand(shape, generator=g) * 6.3
            x = ang.cos() if p["name"] == "cos" else ang.sin()
        elif p["name"] == "temb":
            x = torch.randn(shape, generator=g) * 0.3
        else:
            x = torch.randn(shape, generator=g)
        t[p["name"]] = x.to(dts[p["dtype"]]).to(device)
    return t


@needs_tools
@pytest.mark.slow  # builds every example package (the pkgs fixture)
def test_random_inputs_fit_the_manifests(pkgs):
    """The GPU tests' inputs are what the loader accepts (checked here on the CPU)."""
    for name, d in pkgs.items():
        k = load(d)
        t = _random_inputs(k.manifest, 2, 33, "cpu")
        b = k.bind(**t)
        assert b.symbols == {"B": 2, "N": 33}, name


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _jit(m, t):
    """The JIT (Triton) result of the package's op on copies of ``t``: the Triton kernel
    the package holds, also where an sm_90 call would route to a Gluon kernel (SAME-L's
    fp32 entry: other tiles, so other last bits; ``attention.gluon_ok``)."""
    from ditfuse.aot.ops import get
    from ditfuse.ops import attention

    entry = get(m["op"])
    c = {n: x.clone() for n, x in t.items()}
    for p in m["parameters"]:  # aliased outputs stay aliased
        if p.get("aliases"):
            c[p["name"]] = c[p["aliases"]]
    device_test, attention._gluon_device = attention._gluon_device, lambda o4: False
    try:
        entry.call(entry.resolve(**m["options"]), c)
    finally:
        attention._gluon_device = device_test
    return c


def _outs(m, t):
    return [t[p["name"]] for p in m["parameters"] if p["kind"] == "output"]


def _same_code_as_jit(m) -> bool:
    """Whether the JIT kernel on this GPU is the package's code. The elementwise kernels
    compile to the same arithmetic for every target; a tensor-core package built for
    another architecture is not (sm_80's mma.sync vs the sm_90a wgmma the JIT uses on
    Hopper: the same products, another fp32 accumulation order)."""
    if m["op"] != "sliding_window_attention":
        return True
    cap = torch.cuda.get_device_capability()
    return m["target"].rstrip("a") == f"sm_{cap[0]}{cap[1]}"


def _assert_matches_jit(m, got, want, what):
    """Bitwise where the package is the JIT's code; else within the kernel's tf32 contract
    (and reported)."""
    if _same_code_as_jit(m):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (
            *what,
            (got.float() - want.float()).abs().max(),
        )
    else:
        err = (got.float() - want.float()).abs().max().item()
        scale = want.float().abs().max().item()
        assert err <= 1e-5 * scale, (*what, err, scale)  # fp32 sums re-associated
        print(
            f"{what}: {m['target']} package vs the JIT's sm_90a kernel: max |diff| {err:.3g} "
            f"(max |out| {scale:.3g}); not bitwise by construction"
        )


@gpu
@needs_tools
@pytest.mark.parametrize("image", ["ptx", "auto"])
@pytest.mark.slow  # builds every example package (the pkgs fixture)
def test_gpu_driver_launch_is_bitwise_the_jit(pkgs, image):
    """The package through cuModuleLoadData / cuLaunchKernel, with TensorRT's argument order,
    equals the Triton JIT call bitwise (both images: PTX JIT-compiled by the driver, as
    TensorRT does, and the cubin where it matches the GPU)."""
    for name, d in pkgs.items():
        k = load(d, image=image)
        m = k.manifest
        for B, N in ((1, 1000), (2, 777)):
            t = _random_inputs(m, B, N, "cuda", seed=B * N)
            ref = _jit(m, t)
            k(**t)
            torch.cuda.synchronize()
            for p, got, want in zip(
                [p for p in m["parameters"] if p["kind"] == "output"], _outs(m, t), _outs(m, ref)
            ):
                _assert_matches_jit(m, got, want, (name, image, B, N, p["name"]))


@gpu
@needs_tools
@pytest.mark.slow  # builds every example package (the pkgs fixture)
def test_gpu_cuda_graph_replay(pkgs):
    """The driver launch captured in a CUDA graph and replayed 100 times on new inputs."""
    for name, d in pkgs.items():
        k = load(d)
        m = k.manifest
        B, N = 2, 513
        src = _random_inputs(m, B, N, "cuda", seed=1)
        static = {n: x.clone() for n, x in src.items()}
        for p in m["parameters"]:
            if p.get("aliases"):
                static[p["name"]] = static[p["aliases"]]
        ins = [p["name"] for p in m["parameters"] if p["kind"] == "input"]
        feed = {n: torch.empty_like(static[n]) for n in ins}
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for n in ins:
                static[n].copy_(feed[n])
            k(**static)  # warm up (module load) outside the capture
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for n in ins:
                static[n].copy_(feed[n])
            k(**static)
        for i in range(100):
            new = _random_inputs(m, B, N, "cuda", seed=100 + i)
            for n in ins:
                feed[n].copy_(new[n])
            graph.replay()
            if i % 33 == 0 or i == 99:
                ref = _jit(m, new)
                torch.cuda.synchronize()
                for got, want in zip(_outs(m, static), _outs(m, ref)):
                    _assert_matches_jit(m, got, want, (name, i))


@gpu
@needs_tools
@pytest.mark.slow  # builds every example package (the pkgs fixture)
def test_gpu_launch_time_parity(pkgs):
    """Device time of the package (CUDA graph of 20 launches) vs the JIT kernel's."""
    rows = []
    for name, d in pkgs.items():
        k = load(d)
        m = k.manifest
        B, N = 1, (75600 if m["op"] == "qk_norm_rope" else 32760)
        t = _random_inputs(m, B, N, "cuda")
        r = _jit(m, t)

        def timed(fn):
            fn()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(20):
                    fn()
            g.replay()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            best = float("inf")
            for _ in range(5):
                e0.record()
                g.replay()
                e1.record()
                torch.cuda.synchronize()
                best = min(best, e0.elapsed_time(e1) / 20)
            return best

        from ditfuse.aot.ops import get

        entry = get(m["op"])
        opts = entry.resolve(**m["options"])
        aot = timed(lambda: k(**t))
        jit = timed(lambda: entry.call(opts, r))
        rows.append((name, aot * 1e3, jit * 1e3))
        print(f"{name}: AOT {aot * 1e3:.1f} us, JIT {jit * 1e3:.1f} us")
        if m["op"] != "gated_residual_adaln" and m["op"] != "sliding_window_attention":
            # (the JIT path of those copies its results into the given outputs)
            assert aot <= 1.10 * jit + 2e-3, rows[-1]
