"""``patch(model, linear="fp8")``: a DiT's block linears as FP8 GEMMs.

Every ``nn.Linear`` inside the model's transformer blocks (a top-level child whose name holds
``blocks``: Wan's ``blocks``, FLUX's ``transformer_blocks`` / ``single_transformer_blocks``,
...) whose name matches none of the ``exclude`` patterns gets its weight quantized once to
e4m3 with a scale per output channel and a forward bound on the instance that quantizes the
input a token at a time and runs :func:`ditfuse.ops.linear_fp8.linear_fp8`. The layers kept
in 16 bits by default (:data:`DEFAULT_EXCLUDE`) are the modulation linears inside the blocks
(AdaLN's ``norm*.linear``, Qwen-Image's ``img_mod`` / ``txt_mod``: a handful of rows whose
errors scale every token) and any embedding; outside the blocks (patch / time / text
embeddings, the final projection) nothing is touched.

Where both the diffusers attention class and its processors (diffusers' and ditfuse's) take
the fused projections (:data:`FUSABLE_ATTENTION`: Wan, FLUX.1, FLUX.2), the attention's Q / K /
V linears are first fused (diffusers' ``fuse_projections``: ``to_qkv``, ``to_kv``,
``to_added_qkv``, ``to_added_kv``): one quantization of the input and one wider GEMM instead
of three. The per-channel weight scales make the fused weight the separate ones, row for row.

A ``FeedForward`` with a tanh GELU whose two linears are both FP8 gets one more forward: the
output projection's quantization applies the GELU in the same pass
(``linear_fp8(h, ..., activation="gelu_tanh")``), so the activation is never written in 16
bits; bitwise the layers' own FP8 forwards one after the other.

A block linear wrapped by an adapter (peft's LoRA layers, as diffusers' ``load_lora_weights``
installs them: a module holding ``base_layer`` and the adapter's own linears) gets FP8 on its
``base_layer`` alone; the adapter's linears (``lora_A`` / ``lora_B``: a rank's width, where
FP8 saves nothing and would quantize the input again) stay 16-bit and add their term in the
wrapper's forward as before. Merging the adapter into the FP8 weight afterwards
(``fuse_lora``) cannot work and raises; fused before the patch, the merged weight is what is
quantized.

The 16-bit weight leaves the GPU: it is kept on the CPU (bitwise) for :func:`unpatch_linears`,
and the module's ``weight`` becomes an empty tensor of the same dtype and device, so code
that reads a patched layer's weight fails loudly instead of reading stale values.
"""

from __future__ import annotations

import fnmatch
import types
from typing import Iterable, Optional, Tuple

import torch

from ditfuse.ops.adaln import gated_residual
from ditfuse.ops.linear_fp8 import (
    DIM_MULTIPLE,
    Rows8,
    fp8_gemm_ok,
    linear_fp8,
    quantize_weight,
)
from ditfuse.patching.common import _PATCHED_FWD, PatchReport, hooked

LINEAR_FP8 = "fp8"
#: Name patterns (fnmatch, relative to the model) of block linears kept in 16 bits.
DEFAULT_EXCLUDE: Tuple[str, ...] = ("*norm*", "*img_mod*", "*txt_mod*", "*emb*")
_W16 = "_ditfuse_w16"
LABEL = "fp8 linears"
#: attention classes whose processors read ``fused_projections`` (``_get_qkv_projections``)
FUSABLE_ATTENTION = ("WanAttention", "FluxAttention", "Flux2Attention")
_FUSED = "_ditfuse_fused_qkv"
#: fused projection -> the linears it replaces
_FUSES = {
    "to_qkv": ("to_q", "to_k", "to_v"),
    "to_kv": ("to_k", "to_v"),
    "to_added_qkv": ("add_q_proj", "add_k_proj", "add_v_proj"),
    "to_added_kv": ("add_k_proj", "add_v_proj"),
}
FFN_LABEL = "FFNs (GELU fused into the FP8 quantization)"
_FFN = "_ditfuse_fp8_ffn"
_MERGE_GUARD = "_ditfuse_fp8_merge_guard"


def check_linear(linear) -> None:
    if linear not in (None, False, LINEAR_FP8):
        raise ValueError(f"linear must be None or 'fp8', got {linear!r}")


def _in_blocks(name: str) -> bool:
    return "blocks" in name.split(".", 1)[0]


def _why_not(module: torch.nn.Linear) -> Optional[str]:
    w = module.weight
    if w.dtype not in (torch.float16, torch.bfloat16):
        return f"{w.dtype} weights (FP8 GEMMs serve 16-bit models)"
    if not fp8_gemm_ok(w.device):
        return f"{w.device} has no FP8 tensor cores (sm_89 or newer)"
    if module.in_features % DIM_MULTIPLE or module.out_features % DIM_MULTIPLE:
        return (
            f"{module.in_features} -> {module.out_features} features (the FP8 GEMM wants "
            f"multiples of {DIM_MULTIPLE})"
        )
    return None


def _fp8_forward(self, x) -> torch.Tensor:
    if isinstance(x, Rows8):  # quantized by the kernel before (takes_rows8)
        if x.dtype != self.weight.dtype:
            raise TypeError(f"FP8 linear of a {self.weight.dtype} model got {x.dtype} input")
        return linear_fp8(x, self._ditfuse_w8, self._ditfuse_w8_scale, self.bias)
    if torch.is_grad_enabled() and x.requires_grad:
        raise RuntimeError(
            "ditfuse FP8 linears are inference-only: call the model under "
            "torch.no_grad() or torch.inference_mode(), or unpatch it"
        )
    if x.dtype != self.weight.dtype:
        raise TypeError(f"FP8 linear of a {self.weight.dtype} model got {x.dtype} input")
    if x.stride(-1) != 1 or not _views_as_rows(x):
        x = x.contiguous()
    return linear_fp8(x, self._ditfuse_w8, self._ditfuse_w8_scale, self.bias)


def _ffn_forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    proj, out = self.net[0].proj, self.net[-1]
    h = proj(hidden_states)
    if h.stride(-1) != 1 or not _views_as_rows(h):
        h = h.contiguous()
    return linear_fp8(h, out._ditfuse_w8, out._ditfuse_w8_scale, out.bias, activation="gelu_tanh")


def _takes_residual(linear, x) -> bool:
    """Whether FP8 ``linear`` (unhooked) may add the residual stream ``x`` in its GEMM: x in
    the layer's dtype, no autograd."""
    return (
        is_fp8(linear)
        and isinstance(x, torch.Tensor)
        and x.dtype == linear.weight.dtype
        and not (torch.is_grad_enabled() and x.requires_grad)
    )


def _fp8_input(inp, dtype):
    """``inp`` as ``linear_fp8`` takes it (a :class:`Rows8`, or 16-bit rows of one stride), or
    None where the layer's own forward must see it."""
    if isinstance(inp, Rows8):
        return inp if inp.dtype == dtype else None
    if not isinstance(inp, torch.Tensor) or inp.dtype != dtype:
        return None
    if torch.is_grad_enabled() and inp.requires_grad:
        return None  # the layer's forward raises the inference-only error
    return inp if inp.stride(-1) == 1 and _views_as_rows(inp) else inp.contiguous()


def linear_residual(linear, inp, x, gate, rounding: str = "once") -> torch.Tensor:
    """``ditfuse.gated_residual(x, linear(inp), gate, rounding=rounding)``, bit for bit; where
    ``linear`` is an FP8 linear the residual goes to its GEMM (``linear_fp8(...,
    residual=)``: in the epilogue on sm_90 where the gate is a row a batch entry)."""
    if _takes_residual(linear, x):
        i8 = _fp8_input(inp, x.dtype)
        if i8 is not None:
            w8, s8 = linear._ditfuse_w8, linear._ditfuse_w8_scale
            return linear_fp8(i8, w8, s8, linear.bias, residual=x, gate=gate, rounding=rounding)
    return gated_residual(x, linear(inp), gate, rounding=rounding)


def ffn_residual(ffn, n, x, gate, rounding: str = "once") -> torch.Tensor:
    """``ditfuse.gated_residual(x, ffn(n), gate, rounding=rounding)``, bit for bit; where
    ``ffn`` runs the GELU-fused FP8 forward (unhooked), or is FLUX.2's SwiGLU FFN with an FP8
    output projection, that projection takes the residual (:func:`linear_residual`)."""
    if (
        ffn.__dict__.get(_FFN, False)
        and unhooked(ffn)
        and _takes_residual(ffn.net[-1], x)
        and ffn.net[0].proj.weight.dtype == x.dtype
    ):
        out = ffn.net[-1]
        h = ffn.net[0].proj(n)  # x's dtype: the GELU-fused forward's first half
        if h.stride(-1) != 1 or not _views_as_rows(h):
            h = h.contiguous()
        return linear_fp8(
            h,
            out._ditfuse_w8,
            out._ditfuse_w8_scale,
            out.bias,
            activation="gelu_tanh",
            residual=x,
            gate=gate,
            rounding=rounding,
        )
    if _swiglu_ffn(ffn):  # linear_residual decides whether linear_out's GEMM takes it
        return linear_residual(ffn.linear_out, ffn.act_fn(ffn.linear_in(n)), x, gate, rounding)
    return gated_residual(x, ffn(n), gate, rounding=rounding)


def _swiglu_ffn(m: torch.nn.Module) -> bool:
    """diffusers' ``Flux2FeedForward`` (``linear_out(act_fn(linear_in(x)))``: FLUX.2's SwiGLU
    FFN), unhooked, its forward the class's: its output projection may be called apart."""
    cls = type(m)
    return (
        cls.__name__ == "Flux2FeedForward"
        and cls.__module__.startswith("diffusers.")
        and "forward" not in m.__dict__
        and unhooked(m)
    )


def _fusable_ffn(m: torch.nn.Module) -> bool:
    """A diffusers ``FeedForward`` = [GELU(approximate="tanh") with its ``proj``, Dropout
    (inactive), Linear], both linears FP8, its forward the class's."""
    net = getattr(m, "net", None)
    if (
        type(m).__name__ != "FeedForward"
        or not isinstance(net, torch.nn.ModuleList)
        or len(net) != 3
        or m.__dict__.get(_PATCHED_FWD)
    ):
        return False
    act, drop, out = net
    return (
        type(act).__name__ == "GELU"
        and getattr(act, "approximate", None) == "tanh"
        and _W16 in getattr(act, "proj", torch.nn.Module()).__dict__
        and isinstance(drop, torch.nn.Dropout)
        and (drop.p == 0 or not drop.training)
        and _W16 in out.__dict__
    )


def _views_as_rows(x: torch.Tensor) -> bool:
    try:
        x.view(-1, x.shape[-1])
        return True
    except RuntimeError:
        return False


def _fuse_qkv(model: torch.nn.Module, exclude) -> dict:
    """Fuse the Q / K / V linears of every fusable block attention whose linears are all
    16-bit, unpatched and not excluded; {replaced linear's name: fused linear's name}."""
    replaced = {}
    for name, m in list(model.named_modules()):
        if (
            type(m).__name__ not in FUSABLE_ATTENTION
            or not _in_blocks(name)
            or not getattr(m, "_supports_qkv_fusion", False)
            or getattr(m, "fused_projections", True)
        ):
            continue
        parts = [getattr(m, p, None) for p in ("to_q", "to_k", "to_v")]
        parts += [
            getattr(m, p)
            for p in ("add_q_proj", "add_k_proj", "add_v_proj")
            if getattr(m, p, None) is not None
        ]
        if not all(
            type(p) is torch.nn.Linear
            and p.weight.numel()
            and _why_not(p) is None
            and not p.__dict__.get(_PATCHED_FWD)
            for p in parts
        ):
            continue
        if any(
            fnmatch.fnmatchcase(f"{name}.{p}", pat) for p in _FUSES["to_qkv"] for pat in exclude
        ):
            continue
        with torch.no_grad():
            m.fuse_projections()
        if not getattr(m, "fused_projections", False):
            continue
        m.__dict__[_FUSED] = True
        for fused, gone in _FUSES.items():
            if isinstance(getattr(m, fused, None), torch.nn.Linear):
                for g in gone:
                    replaced[f"{name}.{g}"] = f"{name}.{fused}"
    return replaced


def _adapter_layers(model: torch.nn.Module) -> dict:
    """{name of an adapter's own module: name of the wrapper holding it} for every adapter
    wrapper in ``model`` (a module with a ``base_layer`` module: peft's tuner layers); the
    base layer and what it holds are not the adapter's."""
    owned = {}
    for name, m in model.named_modules():
        base = getattr(m, "base_layer", None)
        if not isinstance(base, torch.nn.Module):
            continue
        kept = {id(b) for b in base.modules()}
        for sub_name, sub in m.named_modules(prefix=name):
            if sub is not m and id(sub) not in kept:
                owned[sub_name] = name
    return owned


def _refuse_merge(self, *args, **kwargs):
    raise RuntimeError(
        "this adapter's base layer runs in FP8 (ditfuse.patch(..., linear='fp8')), which an "
        "adapter cannot be merged into or out of: fuse the adapter (fuse_lora) before "
        "patching, or ditfuse.unpatch first"
    )


def _guard_merges(wrapper: torch.nn.Module) -> None:
    """An adapter wrapper over an FP8 base layer: its merge and unmerge raise (they would
    add to or subtract from the emptied 16-bit weight)."""
    for method in ("merge", "unmerge"):
        if callable(getattr(wrapper, method, None)):
            setattr(wrapper, method, types.MethodType(_refuse_merge, wrapper))
    wrapper.__dict__[_MERGE_GUARD] = True


def _offload(m: torch.nn.Linear) -> None:
    """The 16-bit weight to the CPU (bitwise, for unpatch); an empty one in its place."""
    w = m.weight.data
    m.__dict__[_W16] = w if w.device.type == "cpu" else w.to("cpu", copy=True)
    m.weight.data = torch.empty(0, dtype=w.dtype, device=w.device)


def patch_linears(
    model: torch.nn.Module, report: PatchReport, exclude: Iterable[str] = DEFAULT_EXCLUDE
) -> None:
    """Quantize ``model``'s block linears and bind the FP8 forward on each (module
    docstring); one report line a layer with its precision, counted under :data:`LABEL`."""
    exclude = tuple(exclude)
    replaced = _fuse_qkv(model, exclude)
    adapters = _adapter_layers(model)
    for name, m in model.named_modules():
        if name in replaced:
            if _W16 not in m.__dict__:
                _offload(m)  # unused while fused: off the GPU until unpatch
            report.lines.append(f"  {name}: fused into {replaced[name]}")
            continue
        if type(m) is not torch.nn.Linear or not _in_blocks(name):
            continue
        if _W16 in m.__dict__:
            continue  # already FP8
        if name in adapters:
            report.lines.append(
                f"  {name}: {m.weight.dtype} (an adapter's own layer, of {adapters[name]})"
            )
            continue
        if any(fnmatch.fnmatchcase(name, p) for p in exclude):
            report.lines.append(f"  {name}: {m.weight.dtype} (excluded: {_match(name, exclude)})")
            continue
        if m.__dict__.get(_PATCHED_FWD):
            report.lines.append(f"  {name}: {m.weight.dtype} (its forward is already replaced)")
            continue
        why = _why_not(m)
        if why is not None:
            report.lines.append(f"  {name}: {m.weight.dtype}, exact ({why})")
            continue
        w = m.weight.data
        with torch.no_grad():
            w8, s8 = quantize_weight(w)
        m.register_buffer("_ditfuse_w8", w8, persistent=False)
        m.register_buffer("_ditfuse_w8_scale", s8, persistent=False)
        _offload(m)
        m.forward = types.MethodType(_fp8_forward, m)
        m.__dict__[_PATCHED_FWD] = True
        report.add(LABEL)
        report.lines.append(f"  {name}: fp8 (e4m3 x e4m3, per-token x per-channel scales)")
    for m in model.modules():  # every adapter wrapper over an FP8 layer, nested ones too
        base = getattr(m, "base_layer", None)
        while isinstance(getattr(base, "base_layer", None), torch.nn.Module):
            base = base.base_layer
        if isinstance(base, torch.nn.Linear) and "_ditfuse_w8" in base._buffers:
            _guard_merges(m)
    for name, m in model.named_modules():
        if _in_blocks(name) and _fusable_ffn(m):
            m.forward = types.MethodType(_ffn_forward, m)
            m.__dict__[_PATCHED_FWD] = True
            m.__dict__[_FFN] = True
            report.add(FFN_LABEL)
            report.lines.append(
                f"  {name}: GELU + the output projection's quantization in one pass"
            )


def unhooked(module) -> bool:
    """No hook sees ``module``'s input: none of torch's (pre- or post-forward) and none of
    diffusers' or accelerate's (``common.hooked``). A hook would be handed a :class:`Rows8`
    where it expects the 16-bit activation."""
    return not (hooked(module) or module._forward_pre_hooks or module._forward_hooks)


def is_fp8(linear) -> bool:
    """Whether ``linear`` is a patched FP8 linear whose forward takes a :class:`Rows8`, with
    no hook on it."""
    return (
        isinstance(linear, torch.nn.Linear)
        and "_ditfuse_w8" in linear._buffers
        and linear.__dict__.get("forward") is not None
        and unhooked(linear)
    )


def ffn_takes_rows8(ffn, x) -> bool:
    """Whether FeedForward ``ffn`` runs the GELU-fused FP8 forward, whose input goes to its FP8
    input projection (of ``x``'s dtype) alone: the kernel before it may hand it a
    :class:`Rows8` instead of ``x``."""
    return (
        ffn.__dict__.get(_FFN, False)
        and unhooked(ffn)
        and is_fp8(ffn.net[0].proj)
        and ffn.net[0].proj.weight.dtype == x.dtype
    )


def _match(name: str, patterns) -> str:
    return next(p for p in patterns if fnmatch.fnmatchcase(name, p))


def unpatch_linears(model: torch.nn.Module) -> int:
    """Give every FP8 linear its 16-bit weight back (bitwise) and its class's forward;
    returns how many."""
    n = 0
    for m in model.modules():
        if m.__dict__.pop(_MERGE_GUARD, False):
            m.__dict__.pop("merge", None)
            m.__dict__.pop("unmerge", None)
        if m.__dict__.pop(_FFN, False):
            m.__dict__.pop("forward", None)
            m.__dict__.pop(_PATCHED_FWD, None)
            n += 1
        w16 = m.__dict__.pop(_W16, None)
        if w16 is None:
            continue
        m.weight.data = w16.to(m.weight.device)
        if "_ditfuse_w8" in m._buffers:
            del m._buffers["_ditfuse_w8"], m._buffers["_ditfuse_w8_scale"]
            m.__dict__.pop("forward", None)
            m.__dict__.pop(_PATCHED_FWD, None)
        n += 1
    for m in model.modules():
        if m.__dict__.pop(_FUSED, False):
            m.unfuse_projections()
            if hasattr(m, "to_added_kv"):  # diffusers' unfuse leaves this one
                del m.to_added_kv
    return n
