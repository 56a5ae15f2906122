"""The warp-specialized sm_90 8-bit attention: its quantizers (kernels under the interpreter
on the CPU), the key order that lets P reach the wgmma A operand without a shuffle, the
routing of ditfuse.attention, the sm_90a build (CPU), and the kernel on an sm_90 GPU."""

import math

import pytest
import torch
from conftest import DEVICE

import ditfuse
from ditfuse.ops import attention_api as API
from ditfuse.ops import attention_fp8_ws as WS
from ditfuse.tolerances import ATTENTION_8BIT_COS_MIN, ATTENTION_8BIT_REL_L2_MAX

SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
COS_MIN, REL_L2_MAX = ATTENTION_8BIT_COS_MIN, ATTENTION_8BIT_REL_L2_MAX


def key_position(s: torch.Tensor) -> torch.Tensor:
    return (s & ~15) | (((s >> 1) & 3) << 2) | (((s >> 3) & 1) << 1) | (s & 1)


def test_key_order_matches_the_a_operand_permutation():
    # the kernel's _a_order: P_A[:, k] = P[:, perm[k]] (reshape (N/16, 2, 4, 2), swap the
    # middle axes); V^T must hold key perm[k] at position k
    perm = torch.arange(128).reshape(8, 2, 4, 2).permute(0, 2, 1, 3).reshape(128)
    assert torch.equal(key_position(perm), torch.arange(128))
    assert torch.equal(torch.sort(key_position(torch.arange(128))).values, torch.arange(128))


@pytest.mark.parametrize("S,D", [(300, 64), (129, 128), (64, 128)])
def test_quantize_k_blocks(S, D):
    B, H = 2, 3
    k = (torch.randn(B, S, H, D) * 2 + torch.randn(D) * 5).to(DEVICE, torch.bfloat16)
    k8, kb = WS.quantize_k_blocks(k)
    tiles = -(-S // WS.BLOCK_N)
    assert k8.dtype == torch.int8 and kb.shape == (B * H, tiles)
    mean = k.float().mean(1)  # (B, H, D)
    x = (k.float() - mean[:, None]).permute(0, 2, 1, 3).reshape(B * H, S, D)
    for t in range(tiles):
        xs = x[:, t * 128 : (t + 1) * 128]
        amax = xs.abs().amax(dim=(1, 2))
        torch.testing.assert_close(kb[:, t], amax / 127, rtol=1e-5, atol=0)
        q = k8.permute(0, 2, 1, 3).reshape(B * H, S, D)[:, t * 128 : (t + 1) * 128].float()
        err = (q * kb[:, t, None, None] - xs).abs()
        # one rounding of the mean's summation order on top of half a step
        assert (err <= kb[:, t, None, None] * 0.5 + 1e-3 * amax[:, None, None]).all()


def test_quantize_k_blocks_nan_tile():
    k = torch.randn(1, 200, 1, 64, dtype=torch.bfloat16, device=DEVICE)
    k[0, 150, 0, 5] = float("nan")
    _, kb = WS.quantize_k_blocks(k)
    assert kb[0, 1].isnan() and kb[0, 0].isnan()  # the mean is NaN too: every tile


@pytest.mark.parametrize("S,D", [(300, 64), (100, 128)])
def test_quantize_vt(S, D):
    B, H = 1, 2
    v = (torch.randn(B, S, H, D) * torch.linspace(0.1, 8, D)).to(DEVICE, torch.bfloat16)
    vt, vs = WS.quantize_v(v, a_order=True)
    S_pad = -(-S // 64) * 64
    assert vt.shape == (B, H, D, S_pad) and vs.shape == (B, H, D)
    vt, vs = vt.view(B * H * D, S_pad), vs.view(B * H, D)
    pos = key_position(torch.arange(S_pad))
    deq = vt.float().view(B * H, D, S_pad)[:, :, pos] * vs[..., None]  # natural key order
    ref = v.float().permute(0, 2, 3, 1).reshape(B * H, D, S)
    torch.testing.assert_close(vs, ref.abs().amax(-1) / 448, rtol=1e-6, atol=0)
    assert (deq[..., :S] - ref).abs().max() <= (ref.abs() * 2**-4 + vs[..., None] * 2**-9).max()
    assert (deq[..., S:] == 0).all()


def test_quantize_vt_nan_channel():
    v = torch.randn(1, 70, 1, 64, dtype=torch.bfloat16, device=DEVICE)
    v[0, 3, 0, 9] = float("nan")
    _, vs = WS.quantize_v(v, a_order=True)
    assert vs[0, 0, 9].isnan() and not vs[0, 0, :9].isnan().any()


def test_routing():
    q = torch.randn(1, 64, 2, 64, dtype=torch.bfloat16)
    assert not API._ws_ok(q, q, None)  # CPU: the interpreter runs the Triton kernel
    assert WS.WsConfig.for_head_dim(128).stages >= 2


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_one_key_is_v(layout, monkeypatch):
    """One key: every query gets V's row, bitwise, without a kernel (the warp-specialized
    kernel returned wrong rows there on an H100); zeros for an entry whose mask drops the
    key, NaN for a query with a NaN."""
    B, S, H, D = 3, 77, 2, 64
    q = torch.randn(B, S, H, D).bfloat16()
    k, v = (torch.randn(B, 1, H, D).bfloat16() for _ in range(2))
    q[1, 5, 1, 3] = float("nan")
    km = torch.tensor([[True], [True], [False]])
    t = (lambda x: x.transpose(1, 2).contiguous()) if layout == "bhsd" else (lambda x: x)

    def no_kernel(*a, **kw):
        raise AssertionError("a kernel ran for one key")

    monkeypatch.setattr(API.fp8, "run", no_kernel)
    monkeypatch.setattr(API.fp8, "run_ws", no_kernel)
    for mask in (None, km):
        out = ditfuse.attention(t(q), t(k), t(v), precision="fp8", layout=layout, key_mask=mask)
        assert out.dtype == v.dtype and out.is_contiguous()
        out = out.transpose(1, 2) if layout == "bhsd" else out
        want = v.expand(B, S, H, D).clone()
        want[1, 5, 1] = float("nan")
        if mask is not None:
            want[2] = 0.0
        assert torch.equal(out.isnan(), want.isnan())
        assert torch.equal(out.nan_to_num(7.0), want.nan_to_num(7.0))


def test_ones_operand(monkeypatch):
    """The row sum's operand: an e4m3 (8, BLOCK_N) tile of 1.0, kept once a device (also
    where torch has no CUDA: the capture check is for CUDA devices only)."""
    monkeypatch.setattr(WS, "_ONES", {})
    dev = torch.device("cpu")
    t = WS._ones(dev)
    assert t.dtype == torch.float8_e4m3fn and t.shape == (8, WS.BLOCK_N)
    assert (t.float() == 1.0).all() and WS._ones(dev) is t


def _reference64(q, k, v, key_mask):
    """Softmax attention in float64, (B, S, H, D); a row with no key kept: zeros."""
    qd, kd, vd = (x.double().transpose(1, 2) for x in (q, k, v))
    s = (qd @ kd.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(
        ~key_mask[:, None, None, :], float("-inf")
    )
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return (p @ vd).transpose(1, 2)


def _awkward_mask(B, S):
    """A key mask with a random entry, one keeping every key, one keeping none, one keeping
    a prefix (text padding) -- B of them, cycled."""
    km = torch.rand(B, S, device=DEVICE) > 0.4
    km[1 % B] = True
    km[2 % B] = False
    km[3 % B, : S // 3] = True
    km[3 % B, S // 3 :] = False
    return km


def test_keys_from_mask():
    """The device compaction: each entry's kept keys in order at the front, their count."""
    km = _awkward_mask(4, 77)
    keys = WS.Keys.from_mask(km)
    assert keys.kept.dtype == torch.int32 and keys.count.dtype == torch.int32
    assert keys.kept.shape == (4, 77) and keys.kept.is_contiguous()
    for b in range(4):
        idx = km[b].nonzero().squeeze(1)
        assert keys.count[b] == idx.numel()
        assert torch.equal(keys.kept[b, : idx.numel()].long(), idx)
    assert WS.Keys.from_mask(None) == WS.Keys()


@pytest.mark.parametrize("S,D", [(300, 64), (129, 128)])
def test_quantizers_gather_the_kept_keys(S, D):
    """Under a key mask the K and V quantizers give each entry what they give its kept keys
    alone, bitwise (rows past them: V zeros, K not read)."""
    B, H = 4, 2
    k = (torch.randn(B, S, H, D) * 2 + torch.randn(D) * 5).to(DEVICE, torch.bfloat16)
    v = (torch.randn(B, S, H, D) * torch.linspace(0.1, 8, D)).to(DEVICE, torch.bfloat16)
    km = _awkward_mask(B, S)
    keys = WS.Keys.from_mask(km)
    k8, kb = WS.quantize_k_blocks(k, keys)
    vt, vs = WS.quantize_v(v, a_order=True, keys=keys)
    for b in range(B):
        idx = km[b].nonzero().squeeze(1)
        n = idx.numel()
        if n == 0:
            assert (vt[b].float() == 0).all()
            continue
        k8e, kbe = WS.quantize_k_blocks(k[b : b + 1, idx])
        vte, vse = WS.quantize_v(v[b : b + 1, idx], a_order=True)
        tiles = kbe.shape[1]
        assert torch.equal(k8[b, :n], k8e[0])
        assert torch.equal(kb.view(B, H, -1)[b, :, :tiles], kbe)
        assert torch.equal(vs[b], vse[0])
        S_pad = vte.shape[-1]
        assert torch.equal(vt[b, ..., :S_pad].view(torch.uint8), vte[0].view(torch.uint8))
        assert (vt[b, ..., S_pad:].float() == 0).all()


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_key_mask_hands_the_kernel_each_entry_kept_keys(layout, monkeypatch):
    """With a key mask the warp-specialized route makes one launch for the whole batch and
    hands the kernel each entry's kept keys (no host read of the mask): the kernel stood in
    for by exact attention of the keys it is told of; an entry keeping no key gets zeros."""
    from ditfuse.ops import attention_fp8 as A

    launched = []

    def kernel(q8, q_scale, k4, v4, out4, scale, keys=WS.Keys(), config=None):
        launched.append(keys)
        q = q8.double() * q_scale.double().transpose(1, 2)[..., None]  # (B, S, H, D)
        for b in range(q.shape[0]):
            idx = keys.kept[b, : int(keys.count[b])].long()
            if idx.numel() == 0:
                out4[b].zero_()
                continue
            qd, kd, vd = (x.double().transpose(0, 1) for x in (q[b], k4[b, idx], v4[b, idx]))
            o = torch.softmax(qd @ kd.transpose(-1, -2) * scale, -1) @ vd
            out4[b].copy_(o.transpose(0, 1))
        return out4

    monkeypatch.setattr(WS, "launch", kernel)
    B, S_q, S_kv, H, D = 4, 40, 70, 2, 64
    q, k, v = (
        torch.randn(B, s, H, D, dtype=torch.bfloat16, device=DEVICE) for s in (S_q, S_kv, S_kv)
    )
    km = _awkward_mask(B, S_kv)
    t = (lambda x: x.transpose(1, 2).contiguous()) if layout == "bhsd" else (lambda x: x)
    out = A.run_ws(t(q), t(k), t(v), 1 / math.sqrt(D), layout, km)
    out = out.transpose(1, 2) if layout == "bhsd" else out
    assert len(launched) == 1 and torch.equal(launched[0].count, km.sum(1).int())
    assert (out[2] == 0).all()
    q8, qs = A.quantize_per_token(q)  # the queries the kernel gets, dequantized
    ref = _reference64(q8.double() * qs.transpose(1, 2)[..., None].double(), k, v, km)
    assert torch.allclose(out.double(), ref, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("aligned", [True, False])
def test_int8_q_with_16bit_k_reaches_the_kernel_as_it_is(layout, aligned, monkeypatch):
    """An int8 q with its scales and a 16-bit k go to the warp-specialized kernel with q's
    values and scales unchanged (copied to a contiguous tensor only where q's strides are
    not 16-byte multiples), k / v 16-bit for the route's own quantizers: the launch a 16-bit
    q that quantizes to those values gets."""
    from ditfuse.ops import attention_fp8 as A

    launched = []

    def kernel(q8, q_scale, k4, v4, out4, scale, keys=WS.Keys(), config=None):
        launched.append((q8.clone(), q_scale.clone(), k4, v4, q8.stride(), scale))
        return out4.fill_(0.5)

    monkeypatch.setattr(WS, "launch", kernel)
    monkeypatch.setattr(API, "_ws_ok", lambda q, k, window, q8=False: window is None)
    B, S_q, S_kv, H, D = 2, 40, 70, 3, 64
    g = torch.Generator().manual_seed(3)
    q, k, v = (
        (torch.randn(B, s, H, D, generator=g) * 2).to(DEVICE, torch.bfloat16)
        for s in (S_q, S_kv, S_kv)
    )
    q8, qs = A.quantize_per_token(q)
    if not aligned:  # channels 1..64 of a 65-wide row: row strides of 65 bytes
        wide = torch.randint(-127, 128, (B, S_q, H, D + 1), dtype=torch.int8, device=DEVICE)
        wide[..., 1:] = q8
        q8 = wide[..., 1:]
    t = (lambda x: x.transpose(1, 2)) if layout == "bhsd" else (lambda x: x)
    out = ditfuse.attention(t(q8), t(k), t(v), precision="fp8", q_scale=qs, layout=layout)
    ditfuse.attention(t(q), t(k), t(v), precision="fp8", layout=layout)
    assert (out == 0.5).all() and out.shape == t(q).shape
    (a8, a_s, ak, av, a_st, a_sc), (b8, b_s, bk, bv, _, b_sc) = launched
    assert torch.equal(a8, b8) and torch.equal(a_s, b_s) and a_sc == b_sc
    assert ak.dtype == av.dtype == torch.bfloat16 and torch.equal(ak, bk) and torch.equal(av, bv)
    assert a_st[3] == 1 and all(x % 16 == 0 for x in a_st[:3])


@pytest.mark.parametrize("fmt", ["int8", "fp8"])
def test_8bit_q_with_16bit_k_is_k_quantized_a_token(fmt):
    """Off the warp-specialized kernel (here: the interpreter), an 8-bit q with a 16-bit k
    is the call with k quantized a token in q's format, bitwise; bad companions refused."""
    from ditfuse.reference import quantize_per_token

    B, S_q, S_kv, H, D = 1, 33, 45, 2, 64
    g = torch.Generator().manual_seed(4)
    q, k, v = (
        torch.randn(B, s, H, D, generator=g).to(DEVICE, torch.bfloat16) for s in (S_q, S_kv, S_kv)
    )
    q8, qs = quantize_per_token(q, fmt)
    k8, ks = quantize_per_token(k, fmt)
    mixed = ditfuse.attention(q8, k, v, precision="fp8", q_scale=qs)
    both = ditfuse.attention(q8, k8, v, precision="fp8", q_scale=qs, k_scale=ks)
    assert torch.equal(mixed, both)
    with pytest.raises(ValueError, match="q_scale is required"):
        ditfuse.attention(q8, k, v, precision="fp8")
    with pytest.raises(ValueError, match="k_scale is for an 8-bit k"):
        ditfuse.attention(q8, k, v, precision="fp8", q_scale=qs, k_scale=ks)
    with pytest.raises(ValueError, match="q_scale"):
        ditfuse.attention(q8, k, v, precision="fp8", q_scale=qs[:, :, :-1])
    with pytest.raises(ValueError, match="head_dim"):
        ditfuse.attention(q8[..., :32], k[..., :32], v[..., :32], precision="fp8", q_scale=qs)


@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_gpu_key_mask(layout):
    """Key-masked calls on the warp-specialized route (a random entry, one keeping every key,
    one keeping none, a padded one) and the same call replayed from a CUDA graph against
    float64 and each other (bitwise); the entry keeping no key is zeros."""
    B, S, H, D = 4, 1500, 3, 128
    q, k, v = (torch.randn(B, S, H, D, device="cuda").bfloat16() for _ in range(3))
    km = _awkward_mask(B, S).cuda()
    t = (lambda x: x.transpose(1, 2).contiguous()) if layout == "bhsd" else (lambda x: x)
    ref = _reference64(q, k, v, km)
    with torch.no_grad():
        out = ditfuse.attention(t(q), t(k), t(v), precision="fp8", layout=layout, key_mask=km)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            graphed = ditfuse.attention(
                t(q), t(k), t(v), precision="fp8", layout=layout, key_mask=km
            )
        g.replay()
    # no atomics in the route's sums (K's mean from per-block parts): the same bits each run
    assert torch.equal(out, graphed)
    for o in (out, graphed):
        o = (o.transpose(1, 2) if layout == "bhsd" else o).double()
        assert (o[2] == 0).all()
        o, r = o.flatten(), ref.flatten()
        cos = (o @ r / (o.norm() * r.norm())).item()
        rel = ((o - r).norm() / r.norm()).item()
        assert cos >= COS_MIN and rel <= REL_L2_MAX, (cos, rel)


_BUILD = r"""
import json, re, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
import subprocess, tempfile
from ditfuse.aot.compile import run_cuobjdump, run_ptxas, specialize, tool_path
from ditfuse.tools.inspect_attention_fp8 import key_loop_local, key_loop_opcodes
from ditfuse.kernels.attention_fp8_ws import _attention_8bit_ws_kernel as kern
from ditfuse.ops.attention_fp8_ws import WsConfig
out = []
for D, varlen, rows8 in ((64, False, False), (128, False, False), (128, True, False),
                         (128, False, True), (64, True, True)):
    S, H = 4608, 4
    q = torch.empty(1, S, H, D, dtype=torch.int8, device="meta")
    vt = torch.empty(H * D, S, dtype=torch.float8_e4m3fn, device="meta")
    box = gl.NVMMASharedLayout(swizzle_byte_width=min(128, D), element_bitwidth=8, rank=4)
    qd = TensorDescriptor(q, list(q.shape), list(q.stride()), [1, 64, 1, D], box)
    kd = TensorDescriptor(q, list(q.shape), list(q.stride()), [1, 128, 1, D], box)
    vd = TensorDescriptor(vt, list(vt.shape), list(vt.stride()), [D, 128],
                          gl.NVMMASharedLayout.get_default_for([D, 128], gl.float8e4nv))
    qs = torch.empty(1, H, S, device="meta")
    o = torch.empty(1, S, H, D, dtype=torch.float8_e4m3fn if rows8 else torch.bfloat16,
                    device="meta")
    args = (qd, kd, vd, qs, torch.empty(H, 36, device="meta"), torch.empty(H, D, device="meta"),
            o, torch.empty(8, 128, dtype=torch.float8_e4m3fn, device="meta"),
            torch.empty(1, dtype=torch.int32 if varlen else torch.float32, device="meta"),
            torch.empty(1, dtype=torch.int32, device="meta"), torch.empty(1, S, device="meta"),
            S, S, H, 36, 0.1, *qs.stride(),
            o.stride(0), o.stride(1), o.stride(2))
    cfg = WsConfig.for_head_dim(D)
    kw = dict(D=D, BLOCK_N=128, STAGES=cfg.stages, QK_INT=True, num_warps=4,
              maxnreg=cfg.maxnreg)
    t = GPUTarget("cuda", 90, 32)
    sig, cex, attrs, opts = specialize(kern, args, kw, t)
    ck = triton.compile(GluonASTSource(kern, sig, cex, attrs), target=t, options=opts.__dict__)
    ptx = ck.asm["ptx"]
    pt = run_ptxas(ptx, opts, ck.metadata.name)
    sass = run_cuobjdump(ck.asm["cubin"], ck.metadata.name)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"]); f.flush()
        sass_text = subprocess.run([tool_path("cuobjdump"), "--dump-sass", f.name],
                                   capture_output=True, text=True, check=True).stdout
    out.append(dict(D=D, varlen=varlen, rows8=rows8,
                    div_rn=len(re.findall(r"div\.rn\.f32", ptx)),
                    int8=bool(re.search(r"wgmma\.mma_async\S*\.s32\.s8\.s8", ptx)),
                    e4m3=bool(re.search(r"wgmma\.mma_async\S*\.f32\.e4m3\.e4m3", ptx)),
                    tma="cp.async.bulk.tensor" in ptx, setmaxnreg="setmaxnreg" in ptx,
                    key_loop_local=key_loop_local(sass_text), spill=pt["spill_stores"],
                    loop=key_loop_opcodes(sass_text),
                    serialized=[l for l in pt["ptxas_log"] if "C7514" in l or "C7515" in l]))
print(json.dumps(out))
"""


@pytest.mark.slow
def test_sm90_build():
    """The kernel compiles for sm_90a (a child process without Triton's interpreter), with
    and without a key mask's key counts, with a 16-bit and an e4m3 output: int8 and e4m3
    wgmma, the producer's TMA loads, register reallocation between the partitions, no local
    memory inside its key loops, no wgmma serialized by ptxas, and the key loop's form (P
    used in its own trip, the row sum on the tensor cores)."""
    import json
    import os
    import subprocess
    import sys

    # "0", not unset: without a GPU an unset variable means the interpreter to ditfuse's
    # ``jit``, and the Gluon kernel calls @jit helpers that must be compiled ones
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    r = subprocess.run(
        [sys.executable, "-c", _BUILD], capture_output=True, text=True, env=env, timeout=900
    )
    assert r.returncode == 0, r.stderr[-3000:]
    for row in json.loads(r.stdout.strip().splitlines()[-1]):
        assert row["int8"] and row["e4m3"] and row["tma"] and row["setmaxnreg"], row
        assert row["key_loop_local"] == 0 and not row["serialized"], str(row)
        loop = row["loop"]
        # the longest loop takes two key tiles a trip; P V and the row sum (P @ ones, 64 x 8)
        # on the tensor cores, from P's registers: no e4m3 unpack, no byte moves rebuilding
        # P across the back edge, and under 500 instructions a tile (805 a tile with P
        # carried to the next trip)
        assert loop.get("QGMMA.64x8x32.F32.E4M3.E4M3", 0) == 8, str(loop)
        assert not any("UNPACK" in op or op.startswith("PRMT") for op in loop), str(loop)
        assert sum(loop.values()) < 2 * 500, str(loop)
        # a key mask's count is a loaded value: 16 bytes spilled in the tail tile, once a
        # program (none without a mask); with the e4m3 epilogue's bound held through the key
        # loop, 24 bytes around the tail (none inside the loop: key_loop_local above)
        assert row["spill"] <= (24 if row["rows8"] else 16 if row["varlen"] else 0), str(row)
        # the e4m3 epilogue's scale and its inverse: IEEE divisions (an approximate one
        # would not be quantize_rows' scale)
        assert row["div_rn"] == (4 if row["rows8"] else 0), str(row)


@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize(
    "B,Sq,Skv,H,D,layout",
    [
        (2, 1000, 1777, 3, 128, "bshd"),
        (1, 300, 300, 2, 64, "bhsd"),
        (3, 1, 129, 1, 64, "bshd"),
        (1, 130, 2, 2, 128, "bshd"),
        (1, 256, 256, 2, 128, "bshd"),
        (1, 700, 9000, 2, 64, "bshd"),
    ],
)
def test_gpu_kernel(B, Sq, Skv, H, D, layout):
    q = torch.randn(B, Sq, H, D, device="cuda").bfloat16()
    k = (torch.randn(B, Skv, H, D, device="cuda") + 3 * torch.randn(D, device="cuda")).bfloat16()
    v = torch.randn(B, Skv, H, D, device="cuda").bfloat16()
    t = (lambda x: x.transpose(1, 2)) if layout == "bhsd" else (lambda x: x)
    with torch.no_grad():
        assert API._ws_ok(q, k, None)
        out = t(ditfuse.attention(t(q), t(k), t(v), precision="fp8", layout=layout))
    qd, kd, vd = (x.double().transpose(1, 2) for x in (q, k, v))
    ref = (torch.softmax(qd @ kd.transpose(-1, -2) / math.sqrt(D), -1) @ vd).transpose(1, 2)
    o, r = out.double().flatten(), ref.flatten()
    cos = (o @ r / (o.norm() * r.norm())).item()
    rel = ((o - r).norm() / r.norm()).item()
    assert torch.isfinite(out).all() and cos >= COS_MIN and rel <= REL_L2_MAX, (cos, rel)


@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("masked", [False, True])
def test_gpu_int8_q_is_the_16bit_call(layout, masked):
    """On the kernel: an int8 q (the QK-norm kernel's form: bitwise quantize_per_token) with a
    16-bit k gives bitwise the 16-bit call on the q it quantizes, with or without a key mask."""
    from ditfuse.ops.attention_fp8 import quantize_per_token

    B, S_q, S_kv, H, D = 2, 1000, 1777, 3, 128
    q = (torch.randn(B, S_q, H, D, device="cuda") * 3).bfloat16()
    k = (torch.randn(B, S_kv, H, D, device="cuda") + 3 * torch.randn(D, device="cuda")).bfloat16()
    v = torch.randn(B, S_kv, H, D, device="cuda").bfloat16()
    km = (torch.rand(B, S_kv, device="cuda") < 0.7) if masked else None
    t = (lambda x: x.transpose(1, 2)) if layout == "bhsd" else (lambda x: x)
    q8, qs = quantize_per_token(q)
    with torch.no_grad():
        a = ditfuse.attention(t(q), t(k), t(v), precision="fp8", layout=layout, key_mask=km)
        b = ditfuse.attention(
            t(q8), t(k), t(v), precision="fp8", q_scale=qs, layout=layout, key_mask=km
        )
    assert torch.isfinite(a).all() and torch.equal(a, b)


@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("H", [1, 3, 8])
def test_gpu_one_key_kernel(D, H):
    """The kernel itself at one key (``ditfuse.attention`` answers such calls without it):
    every query gets V's row (softmax over one key is 1), the same bits on every call. The
    build Triton specializes for ``S_kv = 1`` gave NaN or wrong rows, different each call."""
    from ditfuse.ops.attention_fp8 import run_ws

    g = torch.Generator(device="cuda").manual_seed(H * 10 + D)
    q = torch.randn(1, 300, H, D, device="cuda", generator=g).bfloat16()
    k = (torch.randn(1, 1, H, D, device="cuda", generator=g) * 3).bfloat16()
    v = torch.randn(1, 1, H, D, device="cuda", generator=g).bfloat16()
    with torch.no_grad():
        o1 = run_ws(q, k, v, D**-0.5, "bshd")
        o2 = run_ws(q, k, v, D**-0.5, "bshd")
    assert torch.isfinite(o1).all() and torch.equal(o1, o2)
    ref = v.double().expand(1, 300, H, D)
    o, r = o1.double().flatten(), ref.flatten()
    cos = (o @ r / (o.norm() * r.norm())).item()
    rel = ((o - r).norm() / r.norm()).item()
    assert cos >= COS_MIN and rel <= REL_L2_MAX, (cos, rel)


@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("D", [64, 128])
def test_gpu_equal_v_is_v(D):
    """Equal rows of V come out as V on the warp-specialized route, with a key mask too: the
    row sum adds the same rounded P that multiplies V (both on the tensor cores), so the two
    differ only by the tensor cores' truncating accumulation (about 2^-13 of the sum a
    k-step, 8 chained k-steps a trip of two key tiles): at most one bf16 rounding from V."""
    B, S, H = 2, 3000, 3
    q, k = (torch.randn(B, S, H, D, device="cuda").bfloat16() for _ in range(2))
    row = (torch.rand(B, 1, H, D, device="cuda") * 4 - 2).bfloat16()
    v = row.expand(B, S, H, D).contiguous()
    km = torch.rand(B, S, device="cuda") > 0.4
    with torch.no_grad():
        assert API._ws_ok(q, k, None)
        for mask in (None, km):
            out = ditfuse.attention(q, k, v, precision="fp8", key_mask=mask)
            err = (out.float() - v.float()).abs()
            assert (err <= v.float().abs() * 2.0**-7).all(), (err / v.float().abs()).max()


@pytest.mark.skipif(not SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize(
    "dtype,masked,q8,Sq,Skv,H,D",
    [
        (torch.bfloat16, False, False, 1000, 1777, 3, 128),
        (torch.bfloat16, True, False, 300, 700, 2, 64),
        (torch.float16, False, True, 129, 300, 2, 128),
        (torch.bfloat16, True, True, 640, 1029, 4, 128),
    ],
)
def test_gpu_quantize_out_is_the_16bit_output_quantized(dtype, masked, q8, Sq, Skv, H, D):
    """``quantize_out="fp8"`` on the warp-specialized kernel (its epilogue writes e4m3 and the
    scales): bitwise :func:`ditfuse.reference.attention_out_rows8` of the kernel's own 16-bit
    output, every element, with and without a key mask, from 16-bit or int8 q, bf16 / fp16.
    The outputs are poisoned first."""
    from ditfuse.ops.attention_fp8 import quantize_per_token
    from ditfuse.reference import attention_out_rows8

    g = torch.Generator(device="cpu").manual_seed(Sq + Skv)
    B = 2
    q, k, v = (torch.randn(B, S, H, D, generator=g).to("cuda", dtype) for S in (Sq, Skv, Skv))
    v[1] *= 7.0  # the two batch entries' bounds differ
    key_mask = None
    if masked:
        key_mask = torch.rand(B, Skv, generator=g).to("cuda") < 0.6
        key_mask[1, :] = False  # an entry without a key: zeros, scale 1
        v[1] = 0.0
    kw = dict(precision="fp8", key_mask=key_mask)
    if q8:
        q, qs = quantize_per_token(q, "bshd")
        kw["q_scale"] = qs
    with torch.no_grad():
        o16 = ditfuse.attention(q, k, v, **kw)
        torch.cuda.synchronize()
        # poison the allocator's next blocks of the sizes the call takes
        junk = [torch.full((B, Sq, H, D), 0x7E, dtype=torch.uint8, device="cuda")]
        junk.append(torch.full((B, Sq), float("nan"), device="cuda"))
        del junk
        r = ditfuse.attention(q, k, v, quantize_out="fp8", **kw)
    want_q, want_s = attention_out_rows8(o16, v, key_mask)
    assert r.dtype == dtype and r.q.shape == (B, Sq, H * D) and r.scale.shape == (B, Sq)
    assert torch.equal(r.q.view(torch.uint8), want_q.flatten(2).view(torch.uint8))
    assert torch.equal(r.scale, want_s)
    if masked:
        assert (r.scale[1] == 1).all() and (r.q[1].float() == 0).all()


_V_QUANT_BUILD = r"""
import json, re, subprocess, tempfile
import torch, triton
from triton.backends.compiler import GPUTarget
from ditfuse.aot.compile import specialize, tool_path
from ditfuse.kernels.attention_fp8 import _v_quant_kernel as kern
B, S, H, D = 1, 4608, 48, 128
v = torch.empty(B, S, H, D, dtype=torch.bfloat16, device="meta")
amax = torch.empty(B, H, D, dtype=torch.int32, device="meta")
vt = torch.empty(B, H, D, S, dtype=torch.float8_e4m3fn, device="meta")
vs = torch.empty(B, H, D, device="meta")
out = []
for a_order in (True, False):
    args = (v, (amax, amax), amax, vt, vs, S, S, H, v.stride())
    kw = dict(D=D, BLOCK_S=64, A_ORDER=a_order, GATHER=False, num_warps=4)
    t = GPUTarget("cuda", 90, 32)
    sig, cex, attrs, opts = specialize(kern, args, kw, t)
    ck = triton.compile(triton.compiler.ASTSource(kern, sig, cex, attrs), target=t,
                        options=opts.__dict__)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"]); f.flush()
        sass = subprocess.run([tool_path("cuobjdump"), "--dump-sass", f.name],
                              capture_output=True, text=True, check=True).stdout
    out.append(dict(a_order=a_order, byte_stores=len(re.findall(r"STG\.E\.U8", sass)),
                    vector_stores=len(re.findall(r"STG\.E\.128", sass))))
print(json.dumps(out))
"""


@pytest.mark.slow
def test_v_quant_stores_are_vectorized():
    """V's quantizer writes V^T in 16-byte stores in the warp-specialized kernel's key order
    too (the order is permuted in registers; scattered byte stores made it the route's
    slowest pass)."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "0"}
    r = subprocess.run(
        [sys.executable, "-c", _V_QUANT_BUILD],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    for row in json.loads(r.stdout.strip().splitlines()[-1]):
        assert row["byte_stores"] == 0 and row["vector_stores"] > 0, row
