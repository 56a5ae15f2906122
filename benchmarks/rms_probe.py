"""Where the channel RMS (+ SiLU) loses to a copy at wan-vae-out-480p (session 21 probe).

The shipped kernel (one program: 64 positions x all 96 channels, as 64 + 32 channel rows)
takes ~197 us where a contiguous copy of x takes ~147. Timed here (bf16, CUDA graphs, L2
flushed before each replay), each against the shipped call:

  pattern-copy BS,W   the shipped kernel's tiles and addresses, y = x (no reduction, no math)
  pattern-sum  BS,W   + the sum of squares over channels and y = x * inv (no rounding, SiLU)
  tma          BS,W   the full kernel (Wan's rounding, bias, SiLU) with x loaded by TMA
                      (host descriptors over the (C, S) view), y stored with pointers
  tma-st       BS,W   the same with y stored by TMA too

Every variant that computes the op is checked bitwise against the shipped output.

    PYTHONPATH=src python benchmarks/rms_probe.py [shape]
"""
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

import ditfuse
from ditfuse import group_norm as gn
from ditfuse._kernel_utils import _cast_out, _rnd
from ditfuse.bench import graph_us
from ditfuse.shapes import GN_SHAPES


@triton.jit
def _pattern_kernel(x_ptr, y_ptr, S, stride_c, BC: tl.constexpr, BC1: tl.constexpr,
                    BS: tl.constexpr, SUM: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    c0 = tl.arange(0, BC)[:, None]
    c1 = BC + tl.arange(0, BC1)[:, None]
    si = tl.arange(0, BS)[None, :]
    xp = x_ptr + pid * BS
    yp = y_ptr + pid * BS
    x = tl.load(xp + c0 * stride_c + si).to(tl.float32)
    x1 = tl.load(xp + c1 * stride_c + si).to(tl.float32)
    if SUM:
        sq = tl.sum(tl.reshape(x * x, (BC // BC1, BC1, BS)), 0) + x1 * x1
        inv = 1.0 / tl.maximum(tl.sqrt_rn(tl.sum(sq, 0)[None, :]), 1e-12)
        x = x * inv
        x1 = x1 * inv
    tl.store(yp + c0 * stride_c + si, x.to(y_ptr.dtype.element_ty))
    tl.store(yp + c1 * stride_c + si, x1.to(y_ptr.dtype.element_ty))


@triton.jit
def _finish_vals(x, inv, gm, b, scale, ACT: tl.constexpr):
    y = _rnd(x * inv, ACT)
    y = _rnd(y * scale, ACT)
    y = _rnd(y * gm, ACT)
    y = _rnd(y + b, ACT)
    return gn._silu(y)


@triton.jit
def _rms_tma_kernel(xd, xd1, yd, yd1, y_ptr, g_ptr, b_ptr, eps, scale, stride_yc,
                    BC: tl.constexpr, BC1: tl.constexpr, BS: tl.constexpr,
                    TMA_STORE: tl.constexpr):
    pid = tl.program_id(0)
    s0 = pid * BS
    c0 = tl.arange(0, BC)[:, None]
    c1 = BC + tl.arange(0, BC1)[:, None]
    gm = tl.load(g_ptr + c0).to(tl.float32)
    b = tl.load(b_ptr + c0).to(tl.float32)
    gm1 = tl.load(g_ptr + c1).to(tl.float32)
    b1 = tl.load(b_ptr + c1).to(tl.float32)
    x = xd.load([0, s0]).to(tl.float32)
    x1 = xd1.load([BC, s0]).to(tl.float32)
    sq = tl.sum(tl.reshape(x * x, (BC // BC1, BC1, BS)), 0) + x1 * x1
    inv = 1.0 / tl.maximum(tl.sqrt_rn(tl.sum(sq, 0)[None, :]), eps)
    ACT: tl.constexpr = y_ptr.dtype.element_ty
    y = _cast_out(_finish_vals(x, inv, gm, b, scale, ACT), ACT)
    y1 = _cast_out(_finish_vals(x1, inv, gm1, b1, scale, ACT), ACT)
    if TMA_STORE:
        yd.store([0, s0], y)
        yd1.store([BC, s0], y1)
    else:
        si = tl.arange(0, BS)[None, :]
        yp = y_ptr + s0.to(tl.int64)
        tl.store(yp + c0 * stride_yc + si, y)
        tl.store(yp + c1 * stride_yc + si, y1)


name = sys.argv[1] if len(sys.argv) > 1 else "wan-vae-out-480p"
sh = GN_SHAPES[name]
N, C = sh.shape[:2]
S = 1
for d in sh.shape[2:]:
    S *= d
assert N == 1 and C == 96, "the probe is written for one sample of 96 channels"
g = torch.Generator(device="cuda").manual_seed(0)
x = (torch.randn(sh.shape, generator=g, device="cuda") * 2 + 0.5).to(torch.bfloat16)
ps = (C,) + (1,) * (len(sh.shape) - 2)
w = (torch.randn(ps, generator=g, device="cuda") * 0.5 + 1).to(torch.bfloat16)
bias = (torch.randn(ps, generator=g, device="cuda") * 0.2).to(torch.bfloat16)
ref = ditfuse.rms_norm_silu_channels(x, w, bias)
st = gn.rms_settings(C, S)
print(f"{name} {tuple(sh.shape)} shipped settings {st}", flush=True)
t_ship = graph_us(lambda: ditfuse.rms_norm_silu_channels(x, w, bias))
print(f"shipped                {t_ship:8.1f} us", flush=True)
t_copy = graph_us(lambda: torch.empty_like(x).copy_(x))
print(f"torch copy             {t_copy:8.1f} us", flush=True)
x2 = x.view(C, S)
y = torch.empty_like(x)
y2 = y.view(C, S)
for BS in (32, 64, 128):
    for W in (2, 4, 8):
        for SUM in (False, True):
            f = lambda: _pattern_kernel[(S // BS,)](x2, y2, S, S, BC=64, BC1=32, BS=BS, SUM=SUM,
                                                    num_warps=W)
            print(f"pattern-{'sum ' if SUM else 'copy'} BS={BS:<3d} W={W} {graph_us(f):8.1f} us",
                  flush=True)
wv, bv = w.view(C), bias.view(C)
scale = float(C) ** 0.5
for BS in (32, 64, 128):
    xd = TensorDescriptor(x2, [C, S], [S, 1], [64, BS])
    xd1 = TensorDescriptor(x2, [C, S], [S, 1], [32, BS])
    yd = TensorDescriptor(y2, [C, S], [S, 1], [64, BS])
    yd1 = TensorDescriptor(y2, [C, S], [S, 1], [32, BS])
    for W in (4, 8):
        for TS in (False, True):
            def f():
                _rms_tma_kernel[(S // BS,)](xd, xd1, yd, yd1, y2, wv, bv, 1e-12, scale, S,
                                            BC=64, BC1=32, BS=BS, TMA_STORE=TS, num_warps=W,
                                            enable_fp_fusion=False)
            y.fill_(float("nan"))
            try:
                f()
                torch.cuda.synchronize()
                same = torch.equal(y, ref)
                t = graph_us(f)
            except Exception as e:  # noqa: BLE001 -- report and go on
                print(f"tma{'-st' if TS else '   '} BS={BS:<3d} W={W} failed: {type(e).__name__}: {e}"[:300],
                      flush=True)
                continue
            print(f"tma{'-st' if TS else '   '}    BS={BS:<3d} W={W} {t:8.1f} us  bitwise: {same}",
                  flush=True)
print(f"shipped again          {graph_us(lambda: ditfuse.rms_norm_silu_channels(x, w, bias)):8.1f} us")
