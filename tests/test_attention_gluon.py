"""The Gluon kernel of SAME-L's differential entry on Hopper (``ditfuse._attn_gluon``).

CPU: which calls route to it (``attention.gluon_ok``), and its sm_90 build as the launcher
specializes it -- wgmma with the hand-placed waits (1, 1, then 0 ending each trip) that ptxas
keeps (no C7514 serialization), TMA copies, no spills at 128 registers, at most 56 KB of
shared memory at SAME-L (4 programs an SM).
GPU (sm_90 only): its output bitwise the Triton kernel's (``_gluon_device`` off) on SAME's
packed projection views and awkward cases, every element of a poisoned output written.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ditfuse.aot.compile import missing_tools
from ditfuse.ops import attention
from ditfuse.tools import inspect_attention as AB

SRC = Path(__file__).resolve().parents[1] / "src"


def _proj(B, N, H, dt, device, seed=0):
    """SAME's ``to_qkv`` output (B, N, 5 H 64) cut into five (B, N, H, 64) views."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    proj = torch.randn(B, N, 5 * H * 64, generator=g).to(dt).to(device)
    return [t.unflatten(-1, (H, 64)) for t in proj.chunk(5, dim=-1)]


def _routes(q1, k1, v, q2, k2, window=17, **kw):
    p = attention.plan(q1, k1, v, window, q2=q2, k2=k2, **kw)
    B, N, H, D = p.q.shape
    st = attention.launch_settings(
        D, p.q.dtype, p.left, p.right, N, p.differential, p.qk is not None
    )
    o4 = torch.empty(B, N, H, D, dtype=q1.dtype, device=q1.device)
    return attention.gluon_ok(p, o4, st)


def test_routing(monkeypatch):
    """The SAME-L entry's calls, and only they, take the Gluon kernel (device test faked:
    the interpreter never does)."""
    q1, q2, k1, k2, v = _proj(1, 300, 3, torch.bfloat16, "cpu")
    assert not _routes(q1, k1, v, q2, k2)  # the interpreter, a CPU tensor
    monkeypatch.setattr(attention, "_gluon_device", lambda o4: True)
    assert _routes(q1, k1, v, q2, k2)
    assert _routes(q1, k1, v, q2, k2, window=(3, 20), lam=torch.rand(3).to(torch.bfloat16))
    assert _routes(*[t.half() for t in (q1, k1, v, q2, k2)])  # fp16 (contiguous copies)
    bhsd = [t.transpose(1, 2).contiguous() for t in (q1, k1, v, q2, k2)]
    assert _routes(*bhsd, layout="bhsd")
    assert not _routes(q1, k1, v, None, None)  # plain
    f32 = _proj(1, 300, 3, torch.float32, "cpu")
    # fp32: the Gluon kernel multiplies in tf32 ("high" / "medium"); PyTorch's default
    # "highest" takes the Triton kernel's three-term products
    assert not _routes(f32[0], f32[2], f32[4], f32[1], f32[3])
    assert not _routes(f32[0], f32[2], f32[4], f32[1], f32[3], precision="highest")
    assert _routes(f32[0], f32[2], f32[4], f32[1], f32[3], precision="high")  # fp32 entry
    assert _routes(f32[0], f32[2], f32[4], f32[1], f32[3], precision="medium")
    assert _routes(f32[0], f32[2], f32[4], f32[1], f32[3], window=(3, 20), precision="high")
    assert not _routes(f32[0], f32[2], f32[4], None, None)  # fp32 plain
    assert not _routes(f32[0], f32[2], f32[4], f32[1], f32[3], window=40)
    assert not _routes(*[t[..., :32] for t in (f32[0], f32[2], f32[4], f32[1], f32[3])])
    flat32 = torch.randn(1, 300, 5 * 3 * 64 + 2)
    off32 = [t.unflatten(-1, (3, 64)) for t in flat32[..., 2:].chunk(5, dim=-1)]
    assert not _routes(off32[0], off32[2], off32[4], off32[1], off32[3])  # 8 bytes off
    assert not _routes(q1, k1, v, q2, k2, window=(-1, 0))  # unbounded side
    assert not _routes(q1, k1, v, q2, k2, window=40)  # wide band
    small = [t[..., :32] for t in (q1, k1, v, q2, k2)]
    assert not _routes(*small)  # head_dim 32
    # a view one element off 16-byte alignment, channels not contiguous
    flat = torch.randn(1, 300, 5 * 3 * 64 + 1).to(torch.bfloat16)
    off = [t.unflatten(-1, (3, 64)) for t in flat[..., 1:].chunk(5, dim=-1)]
    assert not _routes(off[0], off[2], off[4], off[1], off[3])
    strided = torch.randn(1, 300, 3, 128).to(torch.bfloat16)[..., ::2]
    assert not _routes(strided, k1, v, q2, k2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["16-bit", "fp32"])
def test_max_trips_bounds_every_program(dtype):
    """The kernel has ``TRIPS`` key-tile buffers and mbarriers and visits each program's
    band tiles, so ``max_trips`` must bound every program's trip count (a tile past the
    buffers would read shared memory it does not own and wait on an mbarrier never armed):
    every routed window (narrow bands, both sides bounded), N from 1 past a few tiles, the
    launcher's clamping and query step; and the narrow band keeps it at 4 (<= 64 KB)."""
    from ditfuse.kernels import attention_sm90 as ag
    from ditfuse.kernels import attention_sm90_fp32 as agf

    entry = attention.SAME_L_16BIT if dtype == torch.bfloat16 else attention.SAME_L_FP32
    kern = ag if dtype == torch.bfloat16 else agf
    windows = [(lft, rgt) for lft in range(0, 64, 3) for rgt in range(0, 64 - lft, 5)]
    windows += [(17, 17), (0, 0), (63, 0), (0, 63), (31, 32)]
    for lft0, rgt0 in windows:
        for N in (1, 2, 31, 32, 33, 63, 64, 65, 97, 300, 1000, 4352):
            st = attention.launch_settings(64, dtype, lft0, rgt0, N, True, False)
            if not st.is_entry(entry):
                continue
            lft, rgt = min(lft0, N), min(rgt0, N)
            # the fp32 kernel's own tiles (``_launch_gluon``), the 16-bit one the table's
            step = (
                st.step_m
                if kern is ag
                else attention.query_step(agf.BLOCK_M, agf.BLOCK_N, lft, rgt)
            )
            bound = kern.max_trips(N, lft, rgt, step)
            assert 1 <= bound <= 4, (lft0, rgt0, N, bound)
            for start in range(0, N, step):
                lo, hi = max(start - lft, 0), min(start + step + rgt, N)
                assert -(-(hi - lo) // kern.BLOCK_N) <= bound, (lft0, rgt0, N, start)


_PROBE = r"""
import json, re, sys, torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
import ditfuse
from ditfuse.ops import attention
from ditfuse.tools import inspect_attention as AB
from ditfuse.kernels import attention_sm90 as ag
from ditfuse.kernels import attention_sm90_fp32 as agf
from ditfuse.kernels import attention as _attn_kernel
from ditfuse.aot.compile import intercept_launches, specialize, run_ptxas, run_cuobjdump

attention._gluon_device = lambda o4: True
t = GPUTarget("cuda", 90, 32)
out = []
for label, B, N, H, dt, window, layout, lam_tensor in json.loads(sys.argv[1]):
    dt = getattr(torch, dt)
    proj = torch.empty(B, N, 5 * H * 64, dtype=dt, device="meta")
    q1, q2, k1, k2, v = [x.unflatten(-1, (H, 64)) for x in proj.chunk(5, dim=-1)]
    if layout == "bhsd":
        q1, q2, k1, k2, v = [torch.empty(B, H, N, 64, dtype=dt, device="meta")] * 5
    lam = torch.empty(H, dtype=torch.float32, device="meta") if lam_tensor else 0.8
    call = lambda: ditfuse.sliding_window_attention(q1, k1, v, window, q2=q2, k2=k2, lam=lam,
                                                    layout=layout, precision="high")
    launches = intercept_launches([(ag, "_swa_diff_sm90_kernel"),
                                   (agf, "_swa_diff_fp32_sm90_kernel"),
                                   (_attn_kernel, "_swa_fwd_kernel")], call)
    assert len(launches) == 1, launches
    grid, args, kw = launches[0]
    assert "TRIPS" in kw, "the Triton kernel was launched"
    kern = agf._swa_diff_fp32_sm90_kernel if dt == torch.float32 else ag._swa_diff_sm90_kernel
    sig, cex, attrs, opts = specialize(kern, args, kw, t)
    ck = triton.compile(GluonASTSource(kern, sig, cex, attrs), target=t, options=opts.__dict__)
    ptx = ck.asm["ptx"]
    pt = run_ptxas(ptx, opts, ck.metadata.name)
    out.append(dict(label=label, regs=pt["regs"], spills=pt["spill_stores"],
                    serialized=[ln for ln in pt["ptxas_log"] if "C7514" in ln or "C7515" in ln],
                    tf32=ptx.count("wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32")
                    + ptx.count("wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32"),
                    shared=ck.metadata.shared,
                    waits=re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx),
                    wgmma=ptx.count("wgmma.mma_async"),
                    tma=ptx.count("cp.async.bulk.tensor.4d"), cp_async=ptx.count("cp.async.cg"),
                    step=kw["STEP_M"], grid=list(grid)))
print(json.dumps(out))
"""

BUILD_CASES = [
    ("same-l-8704-bf16", 1, 8704, 24, "bfloat16", 17, "bshd", False),
    ("same-l-32946-fp16-lam", 1, 32946, 24, "float16", 17, "bshd", True),
    ("batch2-odd-heads-bhsd", 2, 1000, 5, "bfloat16", (3, 20), "bhsd", False),
    ("four-tiles-wide-band", 1, 500, 3, "float16", (31, 32), "bshd", False),  # TRIPS 4
]
FP32_BUILD_CASES = [
    ("same-l-8704-fp32", 1, 8704, 24, "float32", 17, "bshd", False),
    ("fp32-batch2-odd-heads-bhsd-lam", 2, 1000, 5, "float32", (3, 20), "bhsd", True),
    ("fp32-four-tiles-wide-band", 1, 500, 3, "float32", (31, 32), "bshd", False),  # TRIPS 4
]


@pytest.mark.slow
@pytest.mark.skipif(bool(missing_tools()), reason="the Triton wheel lacks ptxas / cuobjdump")
def test_sm90_build():
    # "0", not unset: without a GPU an unset variable means the interpreter to ditfuse's
    # ``jit``, and the Gluon kernel calls @jit helpers that must be compiled ones
    env = dict(os.environ, PYTHONPATH=str(SRC), TRITON_INTERPRET="0")
    r = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(BUILD_CASES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert [row["label"] for row in rows] == [c[0] for c in BUILD_CASES]
    for row in rows:
        # the overlap: each score product's wait leaves the other map's wgmma in flight, the
        # trip's last wait retires both P @ V (in the PTX's block order)
        assert sorted(row["waits"]) == ["0", "1", "1"], row
        # and ptxas keeps it: with a wgmma in flight across the loop's back edge whose
        # accumulator is read after its wait, it serializes every wgmma (the form built on
        # 2026-12-04: docs/design/attention.md)
        assert not row["serialized"], row
        # Q1, Q2 and a tile's K1, K2, V by TMA (one box each), no per-thread copies
        assert row["wgmma"] > 0 and row["tma"] >= 5 and row["cp_async"] == 0, row
        # 128 registers with no spills and <= 56 KB: 4 programs an SM at SAME-L's 3 tiles
        assert row["spills"] == 0 and row["regs"] <= 128, row
        assert row["shared"] <= (56 if row["label"].startswith("same-l") else 76) * 1024, row
    assert rows[0]["step"] == 62 and rows[0]["grid"] == [24, -(-8704 // 62)]


@pytest.mark.slow
@pytest.mark.skipif(bool(missing_tools()), reason="the Triton wheel lacks ptxas / cuobjdump")
def test_sm90_build_fp32():
    """The fp32 kernel as the launcher specializes it: tf32 wgmma only (the score products
    from shared memory, P @ V from registers against the transposed V), the same waits as the
    16-bit kernel and a pipeline ptxas keeps, TMA copies, 168 registers with no spills, and
    at SAME-L's 3 key tiles at most 113 KB of shared memory (2 programs an SM)."""
    # "0", not unset: without a GPU an unset variable means the interpreter to ditfuse's
    # ``jit``, and the Gluon kernel calls @jit helpers that must be compiled ones
    env = dict(os.environ, PYTHONPATH=str(SRC), TRITON_INTERPRET="0")
    r = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(FP32_BUILD_CASES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert [row["label"] for row in rows] == [c[0] for c in FP32_BUILD_CASES]
    for row in rows:
        assert sorted(row["waits"]) == ["0", "1", "1"], row
        assert not row["serialized"], row
        assert row["tf32"] == row["wgmma"] > 0 and row["tma"] >= 5 and row["cp_async"] == 0, row
        assert row["spills"] == 0 and row["regs"] <= 168, row
    same_l = rows[0]
    assert same_l["shared"] <= 113 * 1024, same_l
    # 64-query tiles storing 62 (its own tiles, not the Triton fp32 entry's 32 / 30)
    assert same_l["step"] == 62 and same_l["grid"] == [24, -(-8704 // 62)], same_l


# ---------------------------------------------------------------------------------------
# GPU: bitwise the Triton kernel


def _sm90_gpu() -> bool:
    return (
        not attention.backend.INTERPRET
        and torch.cuda.is_available()
        and torch.cuda.get_device_capability()[0] == 9
    )


GPU_CASES = [
    # B, N, H, dtype, window, layout, lam
    (1, 8704, 24, torch.bfloat16, 17, "bshd", 1.0),
    (2, 1000, 24, torch.bfloat16, 17, "bshd", 0.8),
    (1, 4352, 24, torch.float16, 17, "bshd", 0.5),
    (2, 33, 5, torch.bfloat16, 17, "bshd", 0.8),  # N < a tile, odd heads
    (1, 300, 3, torch.bfloat16, 0, "bshd", 0.8),  # window 0
    (1, 301, 3, torch.float16, (3, 20), "bshd", "tensor"),
    (1, 257, 2, torch.bfloat16, (0, 17), "bhsd", 1.0),
    (1, 1, 4, torch.bfloat16, 17, "bshd", 0.8),  # one token
    (3, 129, 7, torch.bfloat16, (17, 0), "bhsd", "tensor"),
    (1, 500, 3, torch.bfloat16, (31, 32), "bshd", 0.8),  # 4 key tiles a program (TRIPS 4)
    (2, 640, 5, torch.float16, (10, 53), "bhsd", "tensor"),
]


@pytest.mark.skipif(not _sm90_gpu(), reason="needs an sm_90 GPU (Gluon's wgmma kernel)")
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{c[4]}-{c[5]}")
def test_bitwise_triton_kernel(case, monkeypatch):
    B, N, H, dt, window, layout, lam = case
    q1, q2, k1, k2, v = _proj(B, N, H, dt, "cuda", seed=N)
    if layout == "bhsd":
        q1, q2, k1, k2, v = [t.transpose(1, 2).contiguous() for t in (q1, q2, k1, k2, v)]
    if lam == "tensor":
        lam = (torch.rand(H, generator=torch.Generator().manual_seed(1)) + 0.1).cuda()
    p = attention.plan(q1, k1, v, window, q2=q2, k2=k2, lam=lam, layout=layout)
    o4s = []
    taken = []
    real = attention._launch_gluon
    device_test = attention._gluon_device
    monkeypatch.setattr(
        attention, "_launch_gluon", lambda *a, **k: (taken.append(1), real(*a, **k))
    )
    for gluon in (True, False):
        monkeypatch.setattr(
            attention, "_gluon_device", device_test if gluon else (lambda o4: False)
        )
        out = torch.full(p.q.shape, float("nan"), dtype=dt, device="cuda")  # poisoned
        attention.launch(p, out)
        o4s.append(out)
    torch.cuda.synchronize()
    assert taken == [1]
    g, t = o4s
    assert not torch.isnan(g).any()
    assert torch.equal(g.view(torch.int16), t.view(torch.int16)), (
        f"{(g != t).sum().item()} elements differ, max |d| {(g.float() - t.float()).abs().max()}"
    )


@pytest.mark.slow
@pytest.mark.skipif(bool(missing_tools()), reason="the Triton wheel lacks ptxas / cuobjdump")
def test_build_report_row():
    """``attention.build_report`` builds the Gluon kernel for its spec (the launch an sm_90 GPU
    takes at SAME-L 8704 bf16) and gates it like the Triton builds: tensor cores, no local
    memory in loops, no spills."""
    rows = {r["name"]: r for r in AB.build_report(["same-l-bf16-attn-gluon", "same-l-bf16-attn"])}
    g, t = rows["same-l-bf16-attn-gluon"], rows["same-l-bf16-attn"]
    assert g["kernel"] == "gluon" and t["kernel"] == "triton"
    assert g["wgmma"] > 0 and not g["violations"] and g["loop_local"] == 0, g
    assert (g["block_m"], g["block_n"], g["step_m"], g["grid"]) == (
        t["block_m"],
        t["block_n"],
        t["step_m"],
        t["grid"],
    )  # the same tiles and programs


@pytest.mark.slow
@pytest.mark.skipif(bool(missing_tools()), reason="the Triton wheel lacks ptxas / cuobjdump")
def test_build_report_rows_fp32():
    """The fp32 Gluon specs (SAME-L 8704 and the TensorRT contract's (B, N, 2H, D) halves):
    the fp32 kernel's own tiles (64 / 32, 62 stored, not the Triton entry's 32 / 16), wgmma
    only, gated like the Triton builds."""
    rows = {
        r["name"]: r for r in AB.build_report(["same-l-fp32-attn-gluon", "same-l-trt-fp32-gluon"])
    }
    for name, N in (("same-l-fp32-attn-gluon", 8704), ("same-l-trt-fp32-gluon", 4352)):
        g = rows[name]
        assert g["kernel"] == "gluon" and g["wgmma"] > 0 and g["mma"] == 0, g
        assert not g["violations"] and g["loop_local"] == 0 and g["spill_stores"] == 0, g
        assert (g["block_m"], g["block_n"], g["step_m"], g["grid"]) == (
            64,
            32,
            62,
            [24, -(-N // 62)],
        ), g


# ---------------------------------------------------------------------------------------
# GPU: the fp32 kernel within the fp32 contract (not the Triton kernel's bits: other tiles)

FP32_GPU_CASES = [
    # B, N, H, window, layout, lam
    (1, 4352, 24, 17, "trt", 1.0),  # the TensorRT contract's q / k views
    (1, 8704, 24, 17, "bshd", 0.8),
    (2, 1000, 5, 17, "bshd", "tensor"),
    (2, 33, 5, 17, "bshd", 0.8),  # N < a tile, odd heads
    (1, 300, 3, 0, "bshd", 0.8),  # window 0
    (1, 301, 3, (3, 20), "bhsd", "tensor"),
    (3, 129, 7, (17, 0), "bhsd", 0.5),
    (1, 500, 3, (31, 32), "bshd", 0.8),  # 4 key tiles a program (TRIPS 4)
    (1, 1, 4, 17, "bshd", 0.8),  # one token
]


@pytest.mark.skipif(not _sm90_gpu(), reason="needs an sm_90 GPU (Gluon's wgmma kernel)")
@pytest.mark.parametrize(
    "case", FP32_GPU_CASES, ids=lambda c: f"{c[0]}x{c[1]}x{c[2]}-{c[3]}-{c[4]}"
)
def test_fp32_within_contract(case, monkeypatch):
    """The fp32 kernel's output (a NaN-poisoned buffer, every element written) within
    ``ACCURACY[fp32]`` of the fp64 formula, as the Triton kernel's; the two kernels agree to
    tf32 rounding."""
    from ditfuse import reference

    B, N, H, window, layout, lam = case
    g = torch.Generator(device="cuda").manual_seed(N)
    if layout == "trt":  # q / k of 2H heads, [q1 | q2]
        q12, k12 = (torch.randn(B, N, 2 * H, 64, generator=g, device="cuda") for _ in range(2))
        v = torch.randn(B, N, H, 64, generator=g, device="cuda")
        q1, q2, k1, k2 = q12[:, :, :H], q12[:, :, H:], k12[:, :, :H], k12[:, :, H:]
        layout = "bshd"
    else:
        q1, q2, k1, k2, v = _proj(B, N, H, torch.float32, "cuda", seed=N)
        if layout == "bhsd":
            q1, q2, k1, k2, v = [t.transpose(1, 2).contiguous() for t in (q1, q2, k1, k2, v)]
    if lam == "tensor":
        lam = (torch.rand(H, generator=torch.Generator().manual_seed(1)) + 0.1).cuda()
    p = attention.plan(
        q1, k1, v, window, q2=q2, k2=k2, lam=lam, layout=layout, precision="high"
    )  # the tf32 products the Gluon fp32 kernel makes
    taken = []
    real = attention._launch_gluon
    device_test = attention._gluon_device
    monkeypatch.setattr(
        attention, "_launch_gluon", lambda *a, **k: (taken.append(1), real(*a, **k))
    )
    outs = []
    for gluon in (True, False):
        monkeypatch.setattr(
            attention, "_gluon_device", device_test if gluon else (lambda o4: False)
        )
        out = torch.full(p.q.shape, float("nan"), device="cuda")
        attention.launch(p, out)
        outs.append(out)
    torch.cuda.synchronize()
    assert taken == [1]
    ref = reference.sliding_window_attention_core(p, torch.float64).double()
    lam_max = lam.abs().max().item() if isinstance(lam, torch.Tensor) else abs(lam)
    scale = ref.abs() + (1 + lam_max) * p.v.double().pow(2).mean().sqrt()
    tol = attention.ACCURACY[torch.float32]
    errs = []
    for out in outs:
        assert not torch.isnan(out).any()
        errs.append(((out.double() - ref).abs() / scale).max().item())
    assert errs[0] <= tol, (errs, tol)
    assert errs[1] <= tol, (errs, tol)
    # both are tf32 products of the same operands: within a few tf32 roundings of each other
    assert ((outs[0] - outs[1]).abs() / scale).max().item() <= 2 * tol
