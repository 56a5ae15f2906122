"""The FP8 GEMM of ``linear_fp8`` (``ditfuse.ops.gemm_fp8``): the persistent Triton kernel
against the fp64 product of its e4m3 operands at awkward shapes (partial tiles in M, N and
K, several tiles a program, grouped tile order), the launch table, the route (sm_90 and
16-byte aligned operands; ``torch._scaled_mm`` elsewhere), the op under torch.compile, the
sm_90 build (no spills), and on a GPU against cuBLASLt's GEMM at Wan's shapes."""

import pytest
import torch

from ditfuse.ops import gemm_fp8 as G
from ditfuse.ops.linear_fp8 import quantize_rows
from ditfuse.reference import gemm_fp8_rows_reference

DEV = "cuda" if torch.cuda.is_available() else "cpu"
#: small tiles (one warpgroup's 64 rows): partial tiles, and on the CPU's two programs
#: several tiles a program in grouped order
SMALL = G.GemmFp8Config(block_m=64, block_n=64, block_k=64, group_m=2, num_stages=2, num_warps=4)


def _operands(M, N, K, dtype, seed, device=DEV):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(M, K, generator=g) * torch.rand(M, 1, generator=g) * 3).to(dtype)
    w = (torch.randn(N, K, generator=g) / K**0.5).to(dtype)
    b = torch.randn(N, generator=g).to(dtype)
    q, s = quantize_rows(x.to(device))
    wq, ws = quantize_rows(w.to(device))
    return q, s, wq, ws, b.to(device)


def _check(y, r, dtype):
    """Every element within the output's rounding (one ulp of the 16-bit type; the
    interpreter truncates fp32 to bf16) plus fp32 accumulation over K."""
    ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-10
    bad = (y.double() - r).abs() > r.abs() * ulp + 1e-4 * r.abs().max()
    assert not bad.any(), (bad.sum().item(), (y.double() - r).abs().max().item())


@pytest.mark.parametrize(
    "M,N,K", [(70, 48, 80), (33, 32, 96), (130, 64, 160), (1, 16, 16), (96, 96, 32)]
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bias", [True, False])
def test_kernel_against_fp64(M, N, K, dtype, bias):
    q, s, wq, ws, b = _operands(M, N, K, dtype, seed=M * 7 + N + K)
    b = b if bias else None
    out = torch.full((M, N), float("nan"), dtype=dtype, device=DEV)  # poisoned
    G.launch_gemm_fp8_rows(q, s, wq, ws, b, out, config=SMALL)
    assert torch.isfinite(out).all()
    _check(out, gemm_fp8_rows_reference(q, s, wq, ws, b), dtype)


def test_kernel_production_tiles_on_the_interpreter():
    """The shipped 128 x 256 x 128 tiles (4 stages, 128-wide output halves) with M, N and K
    all partial: the TMA loads' zero fill and the stores' clipping."""
    M, N, K = 131, 272, 144
    q, s, wq, ws, b = _operands(M, N, K, torch.bfloat16, seed=3)
    cfg = G.gemm_config(M, N, K)
    assert (cfg.block_m, cfg.block_n, cfg.block_k) == (128, 256, 128)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device=DEV)
    G.launch_gemm_fp8_rows(q, s, wq, ws, b, out, config=cfg)
    _check(out, gemm_fp8_rows_reference(q, s, wq, ws, b), torch.bfloat16)


def test_nan_scale_row():
    """A row whose scale is NaN (a NaN or an infinity in the 16-bit row) comes out NaN; the
    others stay finite."""
    q, s, wq, ws, b = _operands(40, 32, 64, torch.bfloat16, seed=5)
    s[7] = float("nan")
    out = torch.full((40, 32), 0.0, dtype=torch.bfloat16, device=DEV)
    G.launch_gemm_fp8_rows(q, s, wq, ws, b, out, config=SMALL)
    assert torch.isnan(out[7]).all()
    assert torch.isfinite(out[torch.arange(40, device=DEV) != 7]).all()


def test_config_table():
    assert G.gemm_config(32760, 5120, 5120) == G.GemmFp8Config(num_stages=4)
    assert G.gemm_config(32760, 15360, 5120).num_stages == 4
    assert G.gemm_config(32760, 5120, 8192).num_stages == 4
    assert G.gemm_config(75600, 5120, 13824).num_stages == 3  # the FFN's output projection
    assert G.gemm_config(512, 64, 4096).block_n == 128
    assert G.gemm_config(512, 144, 4096).block_n == 256


@pytest.mark.skipif(DEV == "cuda", reason="the CPU route (torch._scaled_mm's CPU kernel)")
def test_route_and_fallback_on_the_cpu():
    """On the CPU the route is torch._scaled_mm (cuBLASLt's place), within the same rounding."""
    q, s, wq, ws, b = _operands(50, 48, 64, torch.bfloat16, seed=11)
    assert not G.triton_route(q)
    y = G.gemm_fp8_rows(q, s, wq, ws, b, torch.bfloat16)
    _check(y, gemm_fp8_rows_reference(q, s, wq, ws, b), torch.bfloat16)
    empty = G.gemm_fp8_rows(q[:0], s[:0], wq, ws, b, torch.bfloat16)
    assert empty.shape == (0, 48)


def test_bad_operands():
    q, s, wq, ws, b = _operands(8, 32, 64, torch.bfloat16, seed=1)
    with pytest.raises(TypeError, match="q and w_q must be 2-D float8_e4m3fn"):
        G.gemm_fp8_rows(q.float(), s, wq, ws, b, torch.bfloat16)
    with pytest.raises(ValueError, match="contiguous with one K"):
        G.gemm_fp8_rows(q[:, :32], s, wq, ws, b, torch.bfloat16)
    with pytest.raises(TypeError, match="out_dtype must be float16 or bfloat16"):
        G.gemm_fp8_rows(q, s, wq, ws, b, torch.float32)


def test_compiled_op():
    q, s, wq, ws, b = _operands(24, 32, 64, torch.bfloat16, seed=2, device=DEV)
    eager = G.gemm_fp8_rows(q, s, wq, ws, b, torch.bfloat16)
    f = torch.compile(
        lambda t: G.gemm_fp8_rows(t, s, wq, ws, b, torch.bfloat16),
        fullgraph=True,
        backend="aot_eager",
    )
    assert torch.equal(f(q), eager)
    # the schema check compares e4m3 inputs with arithmetic the CPU lacks for that dtype
    torch.library.opcheck(
        torch.ops.ditfuse.gemm_fp8_rows,
        (q, s, wq, ws, b, torch.bfloat16),
        test_utils=("test_faketensor", "test_aot_dispatch_dynamic"),
    )


_BUILD = r"""
import json, re, subprocess, tempfile
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.tools.tensor_descriptor import TensorDescriptor
from ditfuse.aot.compile import run_ptxas, specialize, tool_path
from ditfuse.kernels.gemm_fp8 import _gemm_fp8_rows_kernel as kern
from ditfuse.ops.gemm_fp8 import gemm_config
from ditfuse.kernels.gemm_fp8 import GemmEpilogue
out = []
# the plain epilogue at the widest Q/K/V shape; the gated residual at the FFN's output
for M, N, K, fused in ((32760, 15360, 5120, False), (75600, 5120, 13824, True)):
    cfg = gemm_config(M, N, K, fused)
    meta = dict(device="meta")
    a = torch.empty(M, K, dtype=torch.float8_e4m3fn, **meta)
    b = torch.empty(N, K, dtype=torch.float8_e4m3fn, **meta)
    c = torch.empty(M, N, dtype=torch.bfloat16, **meta)
    res = (TensorDescriptor.from_tensor(c, [cfg.block_m, cfg.block_n // 2]),
           torch.empty(1, N, **meta), M, 0, 1)
    args = (TensorDescriptor.from_tensor(a, [cfg.block_m, cfg.block_k]),
            TensorDescriptor.from_tensor(b, [cfg.block_n, cfg.block_k]),
            TensorDescriptor.from_tensor(c, [cfg.block_m, cfg.block_n // 2]),
            torch.empty(M, **meta), torch.empty(N, **meta),
            torch.empty(N, dtype=torch.bfloat16, **meta), *res, M, N, K)
    epi = GemmEpilogue(has_bias=True, residual=fused, has_gate=fused,
                       per_op=False)
    kw = dict(EPI=epi, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
              GROUP_M=cfg.group_m, PROGRAMS=132, num_stages=cfg.num_stages,
              num_warps=cfg.num_warps, enable_fp_fusion=False)
    t = GPUTarget("cuda", 90, 32)
    sig, cex, attrs, opts = specialize(kern, args, kw, t)
    ck = triton.compile(triton.compiler.ASTSource(kern, sig, cex, attrs), target=t,
                        options=opts.__dict__)
    pt = run_ptxas(ck.asm["ptx"], opts, ck.metadata.name)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"]); f.flush()
        sass = subprocess.run([tool_path("cuobjdump"), "--dump-sass", f.name],
                              capture_output=True, text=True, check=True).stdout
    out.append(dict(M=M, N=N, K=K, fused=fused, stages=cfg.num_stages, regs=pt["regs"],
                    spill=pt["spill_stores"] + pt["spill_loads"], stack=pt["stack"],
                    smem=ck.metadata.shared, wgmma=len(re.findall(r"\bQGMMA\.", sass)),
                    tma=len(re.findall(r"\bUTMALDG\b", sass)),
                    tma_store=len(re.findall(r"\bUTMASTG\b", sass))))
print(json.dumps(out))
"""


@pytest.mark.slow
def test_sm90_build():
    """The shipped settings compile for sm_90a (a child process without the interpreter):
    no spills, no stack, shared memory within the 227 KB a block can have, FP8 wgmma (QGMMA) on
    the FP8 tiles, TMA loads and stores."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "0"}
    r = subprocess.run(
        [sys.executable, "-c", _BUILD], capture_output=True, text=True, env=env, timeout=900
    )
    assert r.returncode == 0, r.stderr[-3000:]
    for row in json.loads(r.stdout.strip().splitlines()[-1]):
        assert row["spill"] == 0 and row["stack"] == 0, row
        assert row["smem"] <= 227 * 1024, row
        assert row["wgmma"] > 0 and row["tma"] > 0 and row["tma_store"] > 0, row


SM90 = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm_90 GPU",
)


@SM90
@pytest.mark.parametrize(
    "M,N,K",
    [
        (32760, 15360, 5120),
        (32760, 5120, 13824),
        (4097, 5120, 5120),
        (512, 10240, 4096),
        (300, 48, 80),
        (1, 16, 16),
    ],
)
def test_gpu_as_accurate_as_cublaslt(M, N, K):
    """On the H100, with the shipped tiles, against the fp64 contract. The FP8 tensor-core
    accumulator keeps fewer bits than fp32 (cuBLASLt's fast-accumulation mode shares it), so
    an element's error is bounded by the sum of its products' magnitudes, not by the result:
    every element within 2^-7 of that sum (plus the output's rounding), and over all
    elements Triton's error no larger than cuBLASLt's on the same operands (relative L2
    within 5%, max within 25%)."""
    q, s, wq, ws, b = _operands(M, N, K, torch.bfloat16, seed=M + N, device="cuda")
    assert G.triton_route(q)
    y = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    G.launch_gemm_fp8_rows(q, s, wq, ws, b, y)
    r = gemm_fp8_rows_reference(q, s, wq, ws, b)
    mag = (q.double().abs() @ wq.double().abs().t()) * s.double()[:, None] * ws.double()[None, :]
    err = (y.double() - r).abs()
    assert (err <= r.abs() * 2.0**-7 + mag * 2.0**-7).all(), err.max().item()
    err_lt = (G.scaled_mm_rows(q, s, wq, ws, b, torch.bfloat16).double() - r).abs()
    assert err.norm() <= 1.05 * err_lt.norm() + 1e-12 * r.norm(), (err.norm(), err_lt.norm())
    assert err.max() <= 1.25 * err_lt.max() + 2.0**-7 * r.abs().max()


@SM90
def test_gpu_misaligned_operand_is_refused():
    """An activation view starting off a 16-byte boundary: a clear error before any launch
    (cuBLASLt refuses it too, with CUBLAS_STATUS_NOT_SUPPORTED)."""
    q, s, wq, ws, b = _operands(64, 32, 64, torch.bfloat16, seed=4, device="cuda")
    buf = torch.empty(q.numel() + 16, dtype=torch.uint8, device="cuda")
    shifted = buf[1 : 1 + q.numel()].view(torch.float8_e4m3fn).view(64, 64)
    shifted.copy_(q)
    with pytest.raises(ValueError, match="q must start on a 16-byte boundary"):
        G.gemm_fp8_rows(shifted, s, wq, ws, b, torch.bfloat16)


def _residual_case(B, S, N, K, gate_kind, seed, device=DEV):
    """Operands of a GEMM whose epilogue adds a gated residual (B, S, N): ``gate_kind``
    None, "fp32" (Wan's modulation, a row a batch entry), "fp32-shared" (1, 1, N),
    "per_op" (a 16-bit gate, FLUX's chain) or "token" (a row a token, Wan 2.2 TI2V)."""
    q, s, wq, ws, b = _operands(B * S, N, K, torch.bfloat16, seed=seed, device=device)
    g = torch.Generator().manual_seed(seed + 1)
    x = (torch.randn(B, S, N, generator=g) * 4).to(torch.bfloat16).to(device)
    gate = {
        None: None,
        "fp32": torch.rand(B, 1, N, generator=g) * 2 - 0.5,
        "fp32-shared": torch.rand(1, 1, N, generator=g),
        "per_op": (torch.rand(B, 1, N, generator=g) * 2 - 0.5).to(torch.bfloat16),
        "token": torch.rand(B, S, N, generator=g),
    }[gate_kind]
    gate = None if gate is None else gate.to(device)
    return q, s, wq, ws, b, x, gate, gate_kind == "per_op"


@pytest.mark.parametrize("gate_kind", [None, "fp32", "fp32-shared", "per_op"])
@pytest.mark.parametrize("B,S", [(3, 70), (1, 64), (2, 129)])
def test_residual_epilogue_is_gated_residual_bitwise(B, S, gate_kind):
    """The epilogue's gated residual is, bit for bit, the GEMM's output handed to
    ``ditfuse.gated_residual`` (the unfused chain): batch entries that start inside a tile,
    partial tiles, fp32 and 16-bit gates."""
    from ditfuse.ops.adaln import gated_residual

    N, K = 48, 80
    q, s, wq, ws, b, x, gate, per_op = _residual_case(B, S, N, K, gate_kind, seed=B * S)
    y = torch.full((B * S, N), float("nan"), dtype=torch.bfloat16, device=DEV)
    G.launch_gemm_fp8_rows(q, s, wq, ws, b, y, config=SMALL)
    want = gated_residual(x, y.view(B, S, N), gate, rounding="per_op" if per_op else "once")
    out = torch.full((B * S, N), float("nan"), dtype=torch.bfloat16, device=DEV)
    x0 = x.clone()
    G.launch_gemm_fp8_rows(q, s, wq, ws, b, out, residual=x, gate=gate, per_op=per_op, config=SMALL)
    assert torch.equal(out.view(B, S, N), want)
    assert torch.equal(x, x0)  # the residual stream is read, not written


def test_residual_epilogue_production_tiles():
    """The shipped tiles with the residual (3 stages, x's half-tiles through TMA): M, N and K
    partial, a batch entry boundary inside a tile."""
    from ditfuse.ops.adaln import gated_residual

    B, S, N, K = 2, 131, 272, 144
    q, s, wq, ws, b, x, gate, _ = _residual_case(B, S, N, K, "fp32", seed=9)
    cfg = G.gemm_config(B * S, N, K, residual=True)
    assert cfg.num_stages == 3
    y = torch.empty((B * S, N), dtype=torch.bfloat16, device=DEV)
    G.launch_gemm_fp8_rows(q, s, wq, ws, b, y, config=cfg)
    out = torch.full((B * S, N), float("nan"), dtype=torch.bfloat16, device=DEV)
    G.launch_gemm_fp8_rows(q, s, wq, ws, b, out, residual=x, gate=gate, config=cfg)
    assert torch.equal(out.view(B, S, N), gated_residual(x, y.view(B, S, N), gate))


@pytest.mark.parametrize("gate_kind", [None, "fp32", "per_op", "token"])
def test_residual_route(gate_kind):
    """``gemm_fp8_rows(..., residual=)`` on every route is the unfused chain's bits: fused in
    the epilogue where it can be (sm_90, a gate a batch entry), ``ditfuse.gated_residual``
    after the GEMM otherwise (a per-token gate, the CPU)."""
    from ditfuse.ops.adaln import gated_residual

    B, S, N, K = 2, 136, 64, 96
    q, s, wq, ws, b, x, gate, per_op = _residual_case(B, S, N, K, gate_kind, seed=21)
    y = G.gemm_fp8_rows(q, s, wq, ws, b, torch.bfloat16)
    want = gated_residual(x, y.view(B, S, N), gate, rounding="per_op" if per_op else "once")
    got = G.gemm_fp8_rows(q, s, wq, ws, b, torch.bfloat16, x, gate, per_op)
    assert torch.equal(got.view(B, S, N), want)


def test_bad_residual():
    B, S, N, K = 2, 8, 32, 64
    q, s, wq, ws, b, x, gate, _ = _residual_case(B, S, N, K, "fp32", seed=3)
    bf = torch.bfloat16
    with pytest.raises(ValueError, match="residual must be a \\(B, S, N\\) tensor"):
        G.gemm_fp8_rows(q, s, wq, ws, b, bf, x.view(B * S, N), gate)
    with pytest.raises(ValueError, match="expected \\(B, S, 32\\) with B \\* S = 16"):
        G.gemm_fp8_rows(q, s, wq, ws, b, bf, x[:, :4], gate)
    with pytest.raises(ValueError, match="residual must be torch.bfloat16"):
        G.gemm_fp8_rows(q, s, wq, ws, b, bf, x.half(), gate)
    with pytest.raises(ValueError, match="gate must be a floating-point \\(1\\|B, 1\\|S, N\\)"):
        G.gemm_fp8_rows(q, s, wq, ws, b, bf, x, gate[:, :, :16])
    with pytest.raises(ValueError, match="gate.dtype torch.float32 must equal it"):
        G.gemm_fp8_rows(q, s, wq, ws, b, bf, x, gate, True)
    with pytest.raises(ValueError, match="gate is given without a residual"):
        G.gemm_fp8_rows(q, s, wq, ws, b, bf, None, gate)
    out = torch.empty((B * S, N), dtype=bf, device=DEV)
    with pytest.raises(ValueError, match="gate row a batch entry of >= 64 rows"):
        G.launch_gemm_fp8_rows(q, s, wq, ws, b, out, residual=x, gate=gate, config=SMALL)


def test_compiled_op_with_residual():
    B, S, N, K = 2, 12, 32, 64
    q, s, wq, ws, b, x, gate, _ = _residual_case(B, S, N, K, "fp32", seed=4)
    eager = G.gemm_fp8_rows(q, s, wq, ws, b, torch.bfloat16, x, gate)
    f = torch.compile(
        lambda t, r: G.gemm_fp8_rows(t, s, wq, ws, b, torch.bfloat16, r, gate),
        fullgraph=True,
        backend="aot_eager",
    )
    assert torch.equal(f(q, x), eager)
    torch.library.opcheck(
        torch.ops.ditfuse.gemm_fp8_rows,
        (q, s, wq, ws, b, torch.bfloat16, x, gate, False),
        test_utils=("test_faketensor", "test_aot_dispatch_dynamic"),
    )


@SM90
@pytest.mark.parametrize("gate_kind", ["fp32", "per_op"])
def test_gpu_residual_epilogue_bitwise(gate_kind):
    """On the H100 at Wan-14B 480p's FFN output projection (two batch entries, the second
    starting inside a tile): the fused epilogue is the GEMM then ``ditfuse.gated_residual``,
    bit for bit."""
    from ditfuse.ops.adaln import gated_residual

    B, S, N, K = 2, 16380, 5120, 13824
    q, s, wq, ws, b, x, gate, per_op = _residual_case(B, S, N, K, gate_kind, seed=7, device="cuda")
    assert G._fusable(x, gate, K, N)
    y = G.gemm_fp8_rows(q, s, wq, ws, b, torch.bfloat16)
    want = gated_residual(x, y.view(B, S, N), gate, rounding="per_op" if per_op else "once")
    got = G.gemm_fp8_rows(q, s, wq, ws, b, torch.bfloat16, x, gate, per_op)
    assert torch.equal(got.view(B, S, N), want)
