"""``ditfuse check``'s gates of ``patch(attention="fp8")`` on the tiny models (head_dim 64,
bf16, random weights): the patched output against the unpatched model's within the 8-bit
tolerances, every attention call on an 8-bit kernel and on the one its call routes to, and
``unpatch`` restoring the outputs bit for bit.

The route (docs/patching.md, "8-bit attention"): on an sm_90 GPU an unmasked call hands the
warp-specialized kernel 16-bit Q / K (``attention_fp8.run_ws``), a key-padded one with its
key mask (the kept keys compacted on the device); under Triton's interpreter every call takes
the Triton kernel (``attention_fp8.run``), int8 Q / K with the key mask. The gates count the
launches of both entry points, with every call on the 8-bit route (on a GPU, patched models
attend calls of fewer than ``patching.common.EIGHT_BIT_MIN_KEYS`` keys exactly; the tiny
models have a few hundred).
"""

from __future__ import annotations

import contextlib

import torch

from ditfuse.ops import attention_fp8
from ditfuse.patching.common import eight_bit_min_keys
from ditfuse.runtime import backend
from ditfuse.tolerances import ATTENTION_8BIT_COS_MIN, ATTENTION_8BIT_REL_L2_MAX, cos_rel

GATE = "patch fp8 (tiny model)"
#: Wan I2V attends 512 prompt tokens: minutes through the interpreter, GPU only
_GPU_ONLY = ("wan-i2v",)


def _cases(small: bool):
    from ditfuse.tools.tiny_models import FP8_CASES

    return [c for c in FP8_CASES if not (small and c[0] in _GPU_ONLY)]


def planned(small: bool, have_diffusers: bool) -> int:
    return len(_cases(small)) if have_diffusers else 1


@contextlib.contextmanager
def _launches():
    """Record each 8-bit attention launch while the block runs: ("ws", Q / K 16-bit) for the
    warp-specialized kernel, ("triton", with a key mask) for the Triton kernel (or its
    emulation); the module's entry points restored after."""
    seen = []
    run_ws, run = attention_fp8.run_ws, attention_fp8.run

    def spy_ws(q, k, v, scale, layout, key_mask=None, q_scale=None):
        wide = q.dtype in (torch.float16, torch.bfloat16) and k.dtype == q.dtype
        seen.append(("ws", wide and q_scale is None))
        return run_ws(q, k, v, scale, layout, key_mask, q_scale)

    def spy(p):
        seen.append(("triton", p.key_mask is not None))
        return run(p)

    attention_fp8.run_ws, attention_fp8.run = spy_ws, spy
    try:
        yield seen
    finally:
        attention_fp8.run_ws, attention_fp8.run = run_ws, run


def _route_ok(seen, calls: int, sm90: bool) -> bool:
    """``calls`` launches; on sm_90 the warp-specialized kernel with 16-bit Q / K for every
    call, key-padded ones included; elsewhere the Triton kernel only."""
    if len(seen) != calls:
        return False
    if not sm90:
        return all(kind == "triton" for kind, _ in seen)
    return all(kind == "ws" and flag for kind, flag in seen)


@torch.no_grad()
def check_gates(g, device, small: bool) -> None:
    """One row a tiny model (:data:`ditfuse.tools.tiny_models.FP8_CASES`); needs diffusers
    (``ditfuse.tools.check`` skips the gate without it)."""
    import ditfuse
    from ditfuse.ops.attention import _sm90
    from ditfuse.tools.tiny_models import to_dtype

    sm90 = not backend.INTERPRET and device != "cpu" and _sm90(torch.device(device))
    for name, make, inputs, calls in _cases(small):
        model = to_dtype(make(), torch.bfloat16).to(device)
        kw = {
            k: (v.to(device) if isinstance(v, torch.Tensor) else v)
            for k, v in inputs(torch.bfloat16).items()
        }
        ref = model(**kw)[0]
        ditfuse.patch(model, attention="fp8")
        # the tiny models' few keys would take the 16-bit path on a GPU
        with _launches() as seen, eight_bit_min_keys(0):
            out = model(**kw)[0]
        ditfuse.unpatch(model)
        restored = torch.equal(model(**kw)[0], ref)
        cos, rel = cos_rel(out, ref)
        finite = bool(torch.isfinite(out).all())
        route = _route_ok(seen, calls, sm90)
        ok = (
            finite
            and restored
            and route
            and cos >= ATTENTION_8BIT_COS_MIN
            and rel <= ATTENTION_8BIT_REL_L2_MAX
        )
        ws = sum(kind == "ws" for kind, _ in seen)
        g.add(
            GATE,
            name,
            ok,
            f"vs unpatched: cos {cos:.5f} (>= {ATTENTION_8BIT_COS_MIN}), rel L2 {rel:.4f} "
            f"(<= {ATTENTION_8BIT_REL_L2_MAX}); {len(seen)}/{calls} 8-bit launches "
            f"({ws} warp-specialized, {len(seen) - ws} Triton)"
            f"{'' if route else ', NOT the expected route'}"
            f"{'' if finite else '; NON-FINITE'}; unpatch "
            f"{'restores' if restored else 'DOES NOT restore'}",
        )
