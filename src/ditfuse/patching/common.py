"""What the per-model patch modules share: processor and forward replacement (recorded for
``unpatch``), the patch report, rotary-table caching, the concat-buffer activation and the
checks that send a call back to the model's own code."""

from __future__ import annotations

import contextlib
import functools
import types
import weakref
from dataclasses import dataclass, field
from typing import Callable, Dict, List

import torch

from ditfuse.norms import norm_readable
from ditfuse.ops.activations import GELU_KINDS, gelu, supported
from ditfuse.ops.adaln import adaln_modulate
from ditfuse.ops.attention import _sm90
from ditfuse.ops.attention_api import attention as _attention
from ditfuse.ops.attention_fp8 import HEAD_DIMS as HEAD_DIMS_8BIT
from ditfuse.ops.attention_fp8 import triton_kernel_runs
from ditfuse.ops.qk_norm_rope import QuantizedQK, qk_norm_rope
from ditfuse.runtime import backend, library


@library.op("ditfuse::copy_into", mutates_args=("dst",))
def _copy_into_op(src: torch.Tensor, dst: torch.Tensor) -> None:
    """``dst.copy_(src)`` as an opaque mutating op (``cat_activation`` under torch.compile)."""
    dst.copy_(src)


@_copy_into_op.register_fake
def _(src, dst):
    if src.shape != dst.shape or src.dtype != dst.dtype:
        raise ValueError(
            f"copy_into: src {tuple(src.shape)} {src.dtype} into dst {tuple(dst.shape)} {dst.dtype}"
        )


_ORIG_PROC = "_ditfuse_orig_processor"
_PATCHED_FWD = "_ditfuse_patched_forward"


@dataclass
class PatchReport:
    """What :func:`patch` did: one line per model, counts per kind of replacement."""

    lines: List[str] = field(default_factory=list)
    counts: Dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, n: int = 1):
        self.counts[kind] = self.counts.get(kind, 0) + n

    def __str__(self):
        return "\n".join(self.lines)

    def __repr__(self):
        return f"PatchReport({self.counts})"


class Processor:
    """Marks a ditfuse processor class (a subclass of the model's own processor class, this
    first among its bases): :func:`set_processor` does not replace it again."""

    _ditfuse = True


class EightBitProcessor(Processor):
    """A ditfuse processor class with an 8-bit attention path, off by default
    (:func:`processor_factory` turns it on per processor)."""

    _ditfuse_fp8 = False


class FusedProcessor(EightBitProcessor):
    """An :class:`EightBitProcessor` of a processor class that its attention modules call as
    ``(attn, hidden_states, encoder_hidden_states, attention_mask, rotary table)``, in that
    order (FLUX.1's, FLUX.2's double-stream, HunyuanVideo's, Wan's): :meth:`fused` where
    :meth:`fused_ok` holds, else the model's processor on the same arguments (the class after
    this one among the subclass's bases)."""

    def __call__(
        self,
        attn,
        hidden_states,
        encoder_hidden_states=None,
        attention_mask=None,
        image_rotary_emb=None,
    ):
        args = (attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)
        if self.fused_ok(*args):
            return self.fused(*args)
        return super().__call__(*args)


def set_processor(attn, new_proc) -> bool:
    """Replace ``attn``'s processor by ``new_proc`` (keeping the attention backend and the
    context-parallel config of the old one); False if it already is a ditfuse one -- unless
    that one's attention precision (``patch(attention="fp8")`` or not) differs from
    ``new_proc``'s: then it is switched to ``new_proc``'s (True; the original processor
    stays recorded for ``unpatch``)."""
    old = attn.processor
    if getattr(old, "_ditfuse", False):
        fp8 = getattr(new_proc, "_ditfuse_fp8", False)
        if hasattr(type(old), "_ditfuse_fp8") and old._ditfuse_fp8 != fp8:
            old._ditfuse_fp8 = fp8
            return True
        return False
    new_proc.__dict__.update({k: v for k, v in old.__dict__.items() if k not in new_proc.__dict__})
    setattr(attn, _ORIG_PROC, old)
    attn.processor = new_proc
    return True


#: ``patch(attention=FP8)``
FP8 = "fp8"
FP8_LABEL = ", 8-bit attention)"


def original_processor_type(module):
    """The class of ``module``'s processor before :func:`patch` replaced it (None: no
    processor)."""
    return type(module.__dict__.get(_ORIG_PROC, getattr(module, "processor", None)))


def check_attention(attention) -> None:
    """``patch(attention=...)``: True / False (SAME's band attention on / off) or ``"fp8"``
    (that, and the DiT attention processors on 8-bit attention); anything else a ValueError."""
    if isinstance(attention, bool) or (isinstance(attention, str) and attention == FP8):
        return
    raise ValueError(
        f"attention must be True, False or {FP8!r} (8-bit attention in the DiT "
        f"attention processors), got {attention!r}"
    )


def fp8_label(label: str, fp8: bool) -> str:
    """A processor count's label, with the 8-bit attention named where it is on."""
    return label[:-1] + FP8_LABEL if fp8 else label


def _head_dim(attn):
    """The head_dim a processor of ``attn`` attends with: Q's projection width over the
    heads (None where the module does not say)."""
    heads, to_q = getattr(attn, "heads", None), getattr(attn, "to_q", None)
    width = getattr(to_q, "out_features", None)
    if isinstance(heads, int) and heads > 0 and isinstance(width, int):
        return width // heads
    hd = getattr(attn, "head_dim", None)
    return hd if isinstance(hd, int) else None


def rope_pair_ok(rope, rows: int) -> bool:
    """``rope`` is None or a (cos, sin) pair of 2-D tables of ``rows`` rows (the form FLUX's
    and HunyuanVideo's processors receive)."""
    return rope is None or (
        isinstance(rope, (tuple, list))
        and len(rope) == 2
        and rope[0].dim() == 2
        and rope[0].shape[0] == rows
    )


def exact_reason(attn):
    """Why the processor of attention module ``attn`` will attend on the exact 16-bit path
    although ``patch(attention="fp8")`` -- what :func:`use_8bit` checks that the module
    already fixes: its head_dim, its dtype, the device it is on (as patched: a model cast or
    moved later is decided at its calls) -- or None where its calls take the 8-bit kernel
    (those with no mask or a key-padding mask, :func:`attend`)."""
    hd = _head_dim(attn)
    if hd is not None and hd not in HEAD_DIMS_8BIT:
        return f"head_dim {hd}, the 8-bit kernel takes {' or '.join(map(str, HEAD_DIMS_8BIT))}"
    w = next(iter(attn.parameters()), None)
    if w is None:
        return None
    if w.dtype not in (torch.float16, torch.bfloat16):
        return (
            f"{str(w.dtype).replace('torch.', '')} model, the 8-bit path takes float16 / bfloat16"
        )
    if not kernel_8bit_ok(w):
        where = (
            "an sm_90 GPU or the CPU under Triton's interpreter"
            if w.device.type == "cpu"
            else "an sm_90 GPU"
        )
        return f"on {w.device}, the 8-bit kernel runs on {where}"
    return None


def fp8_report_label(label: str, attn) -> str:
    """``label`` of a processor count (with the 8-bit attention named, :func:`fp8_label`) as it
    holds for module ``attn``: unchanged where its calls take the 8-bit kernel, else the
    exact attention it will run and why (:func:`exact_reason`)."""
    if not label.endswith(FP8_LABEL):
        return label
    why = exact_reason(attn)
    return label if why is None else label[: -len(FP8_LABEL)] + f", exact attention: {why})"


def processor_factory(cls, fp8: bool):
    """A constructor of ditfuse processor class ``cls`` (an :class:`EightBitProcessor`) for
    :func:`replace_processors`; its processors take the 8-bit attention path
    (:func:`use_8bit`) when ``fp8``."""

    def make():
        proc = cls()
        proc._ditfuse_fp8 = fp8
        return proc

    return make


def kernel_8bit_ok(t: torch.Tensor) -> bool:
    """The 8-bit attention kernel runs on ``t``'s device: an sm_90 GPU, or the CPU under
    Triton's interpreter. Elsewhere ``ditfuse.attention`` would emulate it in PyTorch (fp32
    scores of the whole sequence), where the 16-bit path is the faster and exact one."""
    if backend.INTERPRET:
        return t.device.type == "cpu"
    return t.is_cuda and _sm90(t.device)


def masked_8bit_ok(t: torch.Tensor) -> bool:
    """A call with a mask may take the 8-bit path on ``t``'s device: where the Triton kernel
    that takes key masks runs (:func:`~ditfuse.ops.attention_fp8.triton_kernel_runs`).
    Elsewhere ``ditfuse.attention`` would emulate it in PyTorch, slower than the exact path,
    so a masked call runs exact there."""
    return triton_kernel_runs(t.device)


def _mask_8bit_dtype(mask) -> bool:
    """A mask :func:`keeps_all` reads: boolean (True keeps a pair) or an additive bias."""
    return isinstance(mask, torch.Tensor) and (mask.dtype == torch.bool or mask.is_floating_point())


def keeps_all(mask) -> torch.Tensor:
    """Whether ``mask`` (boolean, or an additive bias) masks nothing, as a 0-d bool tensor:
    all True, or all zero."""
    return mask.all() if mask.dtype == torch.bool else (mask == 0).all()


def capturing() -> bool:
    """Inside a CUDA-graph capture (no host synchronisation allowed)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def use_8bit(
    proc, query: torch.Tensor, value: torch.Tensor, head_dim: int, mask=None, parallel_config=None
) -> bool:
    """Whether a patched processor's call can take the 8-bit path, before looking at the
    mask's values: ``patch(attention="fp8")``, Q / K projections and V in one 16-bit dtype
    (the output's: fp32 models stay exact), a head_dim the kernel takes, a device it runs on,
    no context-parallel config the 16-bit call would pass (diffusers' dispatch does the
    sequence exchange), and no mask -- or, where :func:`masked_8bit_ok`, one
    :func:`keeps_all` reads."""
    return (
        getattr(proc, "_ditfuse_fp8", False)
        and parallel_config is None
        and value.dtype in (torch.float16, torch.bfloat16)
        and query.dtype == value.dtype
        and head_dim in HEAD_DIMS_8BIT
        and kernel_8bit_ok(value)
        and (mask is None or (_mask_8bit_dtype(mask) and masked_8bit_ok(value)))
    )


def key_padding(mask, batch: int, keys: int):
    """``mask`` as ``ditfuse.attention``'s ``key_mask`` -- bool (``batch``, ``keys``), True:
    the key is attended -- where it is a key-padding mask in SDPA's broadcast form: bool,
    shape (``batch`` or 1, 1, 1, ``keys``), one row of kept keys for every head and query of
    a batch entry (HunyuanVideo's and Qwen-Image's joint masks, FLUX's through
    ``joint_attention_kwargs``). Anything else -- a query x key mask (Chroma's, SkyReels-V2's),
    an additive bias, an integer mask (SDPA refuses it), other shapes -- None. Shapes only,
    never values: no device sync, nothing for torch.compile to branch on."""
    if not (isinstance(mask, torch.Tensor) and mask.dtype == torch.bool and mask.dim() == 4):
        return None
    b, h, q, n = mask.shape
    if b not in (1, batch) or h != 1 or q != 1 or n != keys:
        return None
    return mask.reshape(b, n).expand(batch, n)


def attend(
    eight: bool, mask, attend_8bit: Callable, attend_16bit: Callable, operands: tuple, keys=None
):
    """A patched processor's attention output: ``attend_8bit(*operands)`` where ``eight``
    (:func:`use_8bit`) holds and the call can be attended in 8 bits, else
    ``attend_16bit(*operands)``, the exact 16-bit path. Both return the (B, S, H*D) output,
    contiguous, in V's dtype.

    ``keys``: (batch, joint key count) of a processor whose ``attend_8bit`` takes
    ``key_mask=``; a key-padding ``mask`` (:func:`key_padding`) then goes to the kernel as
    its ``key_mask``, whatever it masks -- no sync, the same graph under torch.compile and in
    a CUDA-graph capture. Any other mask (or any mask without ``keys``) is attended in 8 bits
    only where it masks nothing, the mask then dropped: eager, one device sync to see it;
    under torch.compile a ``torch.cond`` on it (the same sync at run time, both branches
    traced); inside a CUDA-graph capture the 16-bit path (no sync there)."""
    if not eight:
        return attend_16bit(*operands)
    if mask is None:
        return attend_8bit(*operands)
    key_mask = None if keys is None else key_padding(mask, *keys)
    if key_mask is not None:
        return attend_8bit(*operands, key_mask=key_mask)
    if compiling():
        return torch.cond(
            keeps_all(mask),
            lambda *a: attend_8bit(*a).contiguous(),
            lambda *a: attend_16bit(*a).contiguous(),
            _apart(operands),
        )
    if capturing() or not bool(keeps_all(mask)):
        return attend_16bit(*operands)
    return attend_8bit(*operands)


def _apart(operands) -> tuple:
    """``operands`` with no two in one tensor's memory: ``torch.cond`` refuses branch inputs
    that alias each other, as Q / K / V chunked from one projection do (FLUX.2's
    single-stream blocks; fused QKV projections) -- a view of a tensor an earlier operand
    already views is copied. ``_base`` is known while tracing: no op where nothing aliases."""
    roots, out = [], []
    for t in operands:
        root = t if t._base is None else t._base
        if any(root is r for r in roots):
            t = t.clone()
        else:
            roots.append(root)
        out.append(t)
    return tuple(out)


def qk_stream(q, k, q_norm, k_norm, **options):
    """One stream of :func:`joint_qk`: its (B, S_i, H, D) Q / K and the ``qk_norm_rope``
    keywords of that stream -- its norms and ``options`` (its rows of the rotary tables)."""
    return q, k, dict(q_norm=q_norm, k_norm=k_norm, **options)


def attn_qk_norm_rope(attn, query, key, cos=None, sin=None, **options):
    """``qk_norm_rope`` of ``query`` / ``key`` with attention module ``attn``'s own
    ``norm_q`` / ``norm_k``."""
    return qk_norm_rope(query, key, cos, sin, q_norm=attn.norm_q, k_norm=attn.norm_k, **options)


def joint_qk(streams, quantize=None, like: int = 0):
    """The joint Q / K of a joint-attention call, its streams in the model's token order:
    ``streams`` of (q, k, kwargs), (B, S_i, H, D) Q / K and the ``qk_norm_rope`` keywords of
    that stream (its norms, its rows of the rotary tables). Each stream is normalised (and
    rotated) by one kernel straight into its rows of fresh joint Q / K, allocated like stream
    ``like``'s -- where the eager processors normalise, rotate and then concatenate: more
    passes over Q and K, the same values. With ``quantize``: each stream's ``QuantizedQK``
    from its kernel, concatenated (:func:`cat_quantized`)."""
    if quantize:
        return cat_quantized([qk_norm_rope(q, k, quantize=quantize, **kw) for q, k, kw in streams])
    q_like, k_like, _ = streams[like]
    B, _, H, D = q_like.shape
    n = sum(q.shape[1] for q, _, _ in streams)
    q_all, k_all = q_like.new_empty(B, n, H, D), k_like.new_empty(B, n, H, D)
    row = 0
    for q, k, kw in streams:
        rows = slice(row, row + q.shape[1])
        qk_norm_rope(q, k, out=(q_all[:, rows], k_all[:, rows]), **kw)
        row = rows.stop
    return q_all, k_all


def sdpa(proc, dispatch, query, key, value, mask=None) -> torch.Tensor:
    """The model's own 16-bit attention call in processor ``proc``: ``dispatch`` (diffusers'
    ``dispatch_attention_fn``, passed in: diffusers is imported where a model is patched) on
    (B, S, H, D) Q / K / V with the processor's backend and context-parallel config; the
    (B, S, H*D) output in Q's dtype."""
    out = dispatch(
        query,
        key,
        value,
        attn_mask=mask,
        backend=proc._attention_backend,
        parallel_config=proc._parallel_config,
    )
    return out.flatten(2, 3).to(query.dtype)


def cat_quantized(parts) -> QuantizedQK:
    """The joint sequence of quantized streams ((B, S_i, H, D) int8 Q / K with (B, H, S_i)
    scales), in ``parts``' order: the scales are per token, so the streams' concatenation is
    the concatenation of their values and of their scales."""
    if len(parts) == 1:
        return parts[0]
    return QuantizedQK(
        torch.cat([p.q for p in parts], dim=1),
        torch.cat([p.k for p in parts], dim=1),
        torch.cat([p.q_scale for p in parts], dim=2),
        torch.cat([p.k_scale for p in parts], dim=2),
    )


def qk_8bit(key_mask=None):
    """What a patched processor's QK-norm + RoPE kernel writes for its 8-bit attention call
    (one that :func:`use_8bit` lets through): ``None``, 16-bit Q / K, on a GPU
    (:func:`use_8bit` has checked it is an sm_90 one), where
    ``ditfuse.attention(..., precision="fp8")`` takes them to the warp-specialized kernel,
    with or without a key-padding mask (the kept keys compacted); that kernel quantizes Q a
    token and K a 128-key tile after the mean key itself (docs/design/attention_fp8.md) --
    else ``"int8"``: Q / K with per-token scales from the same kernel, for the Triton kernel
    that Triton's interpreter runs. ``key_mask`` does not change the answer."""
    return None if not backend.INTERPRET else "int8"


#: On a GPU, a call attending fewer keys runs the exact 16-bit path: below this the
#: warp-specialized route (kernel + quantizers) measured slower than cuDNN's bf16 SDPA, at
#: parity from here up (docs/design/attention_fp8.md, "Short sequences"). Overridden by
#: :func:`eight_bit_min_keys`.
EIGHT_BIT_MIN_KEYS = 12288
_min_keys = [EIGHT_BIT_MIN_KEYS]


@contextlib.contextmanager
def eight_bit_min_keys(n: int):
    """Within the block, patched processors attend calls of at least ``n`` keys in 8 bits on
    a GPU (0: every call the kernel takes), instead of :data:`EIGHT_BIT_MIN_KEYS`. Read when
    a processor runs (under ``torch.compile``: when it is traced)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be an int >= 0 (a key count), got {n!r}")
    old = _min_keys[0]
    _min_keys[0] = n
    try:
        yield
    finally:
        _min_keys[0] = old


def min_keys_8bit() -> int:
    """The fewest keys a GPU call needs for the 8-bit route now (:func:`enough_keys_8bit`)."""
    return _min_keys[0]


def enough_keys_8bit(n_keys: int, on_gpu: bool) -> bool:
    """Whether a call of ``n_keys`` keys is worth the 8-bit route: on a GPU at least the
    current minimum (:data:`EIGHT_BIT_MIN_KEYS`, :func:`eight_bit_min_keys`); under Triton's
    interpreter (the CPU tests) always."""
    return not on_gpu or n_keys >= _min_keys[0]


def attention_8bit(qk, value: torch.Tensor, k=None, k_scale=None, key_mask=None, quantize_out=None):
    """``ditfuse.attention(..., precision="fp8")`` of (B, S, H, D) Q / K -- ``qk`` a
    ``QuantizedQK`` (int8 with per-token scales) or a 16-bit (q, k) pair, as :func:`qk_8bit`
    chose -- and 16-bit V (``k`` / ``k_scale``: other keys for the same queries, in ``qk``'s
    form; ``k_scale`` None for 16-bit ones), ``key_mask`` (bool (B, S_kv),
    :func:`key_padding`) the keys attended; (B, S, H, D) in V's dtype. A GPU call of fewer
    keys than :func:`enough_keys_8bit` wants attends the 16-bit Q / K exactly instead (SDPA,
    with the key mask as its mask). ``quantize_out="fp8"``: an 8-bit call's output as the
    e4m3 rows of an FP8 output projection (a ``Rows8``, (B, S, H*D)); the exact call's
    stays 16-bit."""
    if not isinstance(qk, QuantizedQK):
        q, k = qk[0], qk[1] if k is None else k
        if not enough_keys_8bit(k.shape[1], k.is_cuda):
            return _attention(q, k, value, key_mask=key_mask)
        return _attention(q, k, value, precision=FP8, key_mask=key_mask, quantize_out=quantize_out)
    k, k_scale = (qk.k, qk.k_scale) if k is None else (k, k_scale)
    return _attention(
        qk.q,
        k,
        value,
        precision=FP8,
        q_scale=qk.q_scale,
        k_scale=k_scale,
        key_mask=key_mask,
        quantize_out=quantize_out,
    )


#: the report's label of the attention processors with the fused QK-norm + RoPE
QK_LABEL = "attention processors (QK-norm + RoPE)"


def replace_qk_processors(model, report, table, attention, label: str = QK_LABEL) -> None:
    """:func:`replace_processors` with the ditfuse classes of ``table`` (``{processor class:
    ditfuse class}``, classes with an 8-bit path), on 8-bit attention where ``attention`` is
    ``"fp8"`` (:func:`processor_factory`); counted under ``label`` (:func:`fp8_label`)."""
    fp8 = attention == FP8
    replace_processors(
        model,
        report,
        {k: processor_factory(v, fp8) for k, v in table.items()},
        fp8_label(label, fp8),
    )


def replace_and_bind(model, report, attention, processors=None, forwards=None) -> None:
    """A model family's patch: the QK processors of ``processors``
    (:func:`replace_qk_processors`) and the fused forwards of ``forwards``
    (:func:`bind_forwards`); a table None where its part is switched off."""
    if processors is not None:
        replace_qk_processors(model, report, processors, attention)
    if forwards is not None:
        bind_forwards(model, report, forwards)


def replace_processors(model, report, table, label: str) -> None:
    """Give every module whose processor's class is a key of ``table`` a new instance of
    the mapped ditfuse class (a module patched before: its original processor's class, so
    that patching again with another ``attention`` switches its precision); counted in
    ``report`` under ``label`` -- an 8-bit label under the exact attention a module will run
    instead, with the reason (:func:`fp8_report_label`)."""
    for m in model.modules():
        new = table.get(original_processor_type(m))
        if new is not None and set_processor(m, new()):
            report.add(fp8_report_label(label, m))


def _identity(x):
    return x


def _returns(t):
    return lambda *_: t


class Projected:
    """Attention module ``attn`` as its diffusers processor sees it once ditfuse has computed
    the projections the processor reads, so that the processor's own code runs on them (its
    attention calls and their context-parallel config, its KV cache): each keyword names a
    projection of the module (``to_q=q``), whose call then returns that tensor whatever it is
    given; the norms are identities (the tensors given are normalised, and rotated where the
    processor is called without its rotary table); no fused projections (the processor calls
    the projections one by one). ``out=False``: ``to_out`` identities too (the caller
    projects the attention output). Every other attribute is the module's."""

    norm_q = norm_k = norm_added_q = norm_added_k = staticmethod(_identity)
    fused_projections = False

    def __init__(self, attn, out: bool = True, **projections):
        self._attn = attn
        if not out:
            self.to_out = (_identity, _identity)
        for name, t in projections.items():
            setattr(self, name, _returns(t))

    def __getattr__(self, name):
        return getattr(self._attn, name)


def plain_layer_norms(*norms) -> bool:
    """Whether every module is a ``torch.nn.LayerNorm`` without affine parameters (the norm2 /
    norm1 of the DiT blocks whose chains the AdaLN kernels reproduce with ``norm="layer"``)."""
    return all(
        isinstance(n, torch.nn.LayerNorm) and n.weight is None and n.bias is None for n in norms
    )


def per_op_modulate(x, shift, scale, norm, out=None):
    """``norm(x) * (1 + scale) + shift`` of an affine-free LayerNorm ``norm`` as one AdaLN
    kernel, every step rounded as a block computing in the activation dtype rounds it."""
    return adaln_modulate(x, shift, scale, norm="layer", eps=norm.eps, rounding="per_op", out=out)


def double_block_ok(block, hidden_states, encoder_hidden_states, temb, *_, **__) -> bool:
    """Whether ``streams.mlp_tails`` reproduces a FLUX-style double-stream block (FLUX.1,
    HunyuanVideo) called with these arguments: its norm2 / norm2_context the affine-free
    LayerNorms, both streams (B, S, C) in the dtype of norm1's AdaLN linear (per-op rounding
    needs the gates and modulations in that dtype too), no autograd."""
    x, c = hidden_states, encoder_hidden_states
    return (
        plain_layer_norms(block.norm2, block.norm2_context)
        and x.dim() == 3
        and c.dim() == 3
        and x.dtype == c.dtype == block.norm1.linear.weight.dtype
        and not needs_grad(block, x, c, temb)
    )


def single_block_ok(block, hidden_states, encoder_hidden_states, temb, *_, **__) -> bool:
    """Whether ``streams.single_block`` reproduces a FLUX-style single-stream block called with
    these arguments: no autograd, both streams in the dtype of its AdaLN linear."""
    return not needs_grad(block, hidden_states, encoder_hidden_states, temb) and (
        hidden_states.dtype == encoder_hidden_states.dtype == block.norm.linear.weight.dtype
    )


def gelu_into_buffer(act, mlp, parts):
    """``torch.cat([torch.cat(parts, 1), act(mlp)], 2)`` built in one buffer
    (:func:`cat_activation`: the attention output's parts copied once, the GELU of an
    ``nn.GELU`` written by the kernel into the MLP columns); None where the eager code must
    run."""
    if (
        type(act) is not torch.nn.GELU
        or act.approximate not in GELU_KINDS
        or mlp.dim() != 3
        or not cat_fusable(parts, mlp, "gelu")
    ):
        return None
    return cat_activation(
        parts, mlp, lambda h, out: gelu(h, act.approximate, out=out), mlp.shape[-1]
    )


def join_tokens(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """``torch.cat([first, second], dim=1)`` of two (B, T, D) / (B, S, D) tensors, without a
    copy when they are adjacent token ranges of one buffer -- as FLUX.1's and HunyuanVideo's
    single blocks hand each other their output, ``out[:, :T], out[:, T:]``, which the next
    block concatenates
    again (a copy of every activation a block, 28 MB at 1024^2). Then the result is a view
    of that buffer (equal values; the patched blocks only read it). Eager only: under
    torch.compile the cat is inductor's."""
    if not compiling() and _adjacent(first, second):
        B, T, D = first.shape
        return first.as_strided(
            (B, T + second.shape[1], D),
            (first.stride(0) if B > 1 else (T + second.shape[1]) * D, D, 1),
        )
    return torch.cat([first, second], dim=1)


def _adjacent(a, b) -> bool:
    if not (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.dim() == b.dim() == 3
        and a.dtype == b.dtype
        and a.device == b.device
        and a.shape[0] == b.shape[0]
        and a.shape[2] == b.shape[2]
        and a.shape[1] > 0
        and b.shape[1] > 0
    ):
        return False
    B, T, D = a.shape
    N = T + b.shape[1]
    if a.stride()[1:] != (D, 1) or b.stride()[1:] != (D, 1):
        return False
    if B > 1 and not (a.stride(0) == b.stride(0) == N * D):
        return False
    return (
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        and b.data_ptr() == a.data_ptr() + T * D * a.element_size()
    )


def _parts(first):
    return tuple(first) if isinstance(first, (tuple, list)) else (first,)


def cat_activation(first, h, act, width: int):
    """``torch.cat([first, act(h)], dim=-1)`` with the activation written straight into the
    concat buffer (``act(h, out=buf[..., D:])``, a ditfuse activation of ``width`` output
    channels): ``first`` is copied once, the activation's output is never a separate tensor.
    ``first`` may be a sequence of (B, S_i, D) tensors standing for their concatenation along
    the tokens (HunyuanVideo's image and text attention outputs): each lands in its rows."""
    parts = _parts(first)
    D = parts[0].shape[-1]
    buf = h.new_empty(*h.shape[:-1], D + width)
    # Under torch.compile every write is a mutating op on a view of the fresh buffer, which
    # inductor performs in place; a ``copy_`` there would become a slice_scatter that
    # copies the whole buffer once more.
    copy = _copy_into if compiling() else (lambda src, dst: dst.copy_(src))
    if len(parts) == 1:
        copy(parts[0], buf[..., :D])
    else:
        row = 0
        for t in parts:
            copy(t, buf[:, row : row + t.shape[1], :D])
            row += t.shape[1]
    act(h, out=buf[..., D:])
    return buf


def _copy_into(src, dst) -> None:
    torch.ops.ditfuse.copy_into(src, dst)


def compiling() -> bool:
    """Inside torch.compile (where the patched code leaves some elementwise work to inductor:
    see :func:`cat_fusable`)."""
    return torch.compiler.is_compiling()


_TABLES: Dict[tuple, tuple] = {}


def table_once(src: torch.Tensor, tag: str, make: Callable[[torch.Tensor], torch.Tensor]):
    """``make(src)`` for a rotary table ``src``, computed once per table: every block of a
    step receives the same table objects, and the form ``qk_norm_rope`` reads fastest
    (contiguous; for Wan full width) is a copy of them. Cached while ``src`` lives and is
    not modified in place (its version counter); under torch.compile computed in the graph
    (inductor deduplicates it across the blocks of a graph)."""
    if compiling():
        return make(src)
    key = (id(src), tag)
    hit = _TABLES.get(key)
    if hit is not None:
        ref, version, out = hit
        if ref() is src and version == src._version:
            return out
    out = make(src)
    for k in [k for k, (r, _, _) in _TABLES.items() if r() is None]:
        del _TABLES[k]
    _TABLES[key] = (weakref.ref(src), src._version, out)
    return out


def cat_fusable(first, h, op: str) -> bool:
    """Whether :func:`cat_activation` computes ``torch.cat([first, act(h)], -1)``: same dtype
    (cat would promote), same leading shape (the parts' tokens adding up to h's), an ``h``
    the kernel takes as it is. Under torch.compile GELU only: the kernel writes the buffer's
    MLP columns and ``first`` is copied into the others, both as mutating ops on views of
    the fresh buffer that inductor performs in place, faster than inductor's own cat + GELU
    kernel; SwiGLU stays inductor's there, its fused kernel leaving ditfuse's SwiGLU plus the
    copy nothing to gain (docs/design/activations.md)."""
    parts = _parts(first)
    if compiling() and op != "gelu":
        return False
    if not all(isinstance(t, torch.Tensor) and t.dtype == h.dtype for t in parts):
        return False
    if len(parts) > 1:
        if not (
            h.dim() == 3
            and all(
                t.dim() == 3 and t.shape[0] == h.shape[0] and t.shape[2] == parts[0].shape[2]
                for t in parts
            )
            and sum(t.shape[1] for t in parts) == h.shape[1]
        ):
            return False
    elif parts[0].shape[:-1] != h.shape[:-1]:
        return False
    return supported(h, op)


HOOKED = "forwards left in place: hooks installed (patch before enable_cache / offloading)"


def hooked(module) -> bool:
    """Whether ``module.forward`` is wrapped by diffusers hooks (``enable_cache``, group
    offloading, layerwise casting: ``module._diffusers_hook``) or accelerate's (CPU offload:
    ``module._hf_hook``). Binding a forward over them would drop the hook (its onloading,
    caching or casting); patched before them, the hooks wrap the fused forward."""
    reg = getattr(module, "_diffusers_hook", None)
    return bool(reg is not None and getattr(reg, "hooks", None)) or hasattr(module, "_hf_hook")


def bind_forward(module, fn: Callable, report=None) -> bool:
    """Bind ``fn`` as ``module.forward`` (instance attribute); False if already patched, or
    if hooks wrap the module's forward (counted in ``report`` under :data:`HOOKED`)."""
    if _PATCHED_FWD in module.__dict__:
        return False
    if hooked(module):
        if report is not None:
            report.add(HOOKED)
        return False
    module.forward = types.MethodType(fn, module)
    module.__dict__[_PATCHED_FWD] = True
    return True


def bind_forwards(model, report, table) -> None:
    """Bind a fused forward to every module whose class is exactly a key of ``table``
    (``{cls: (forward, label)}``; subclasses may compute something else), counted in
    ``report`` under the label."""
    for m in model.modules():
        fn, label = table.get(type(m), (None, None))
        if fn is not None and bind_forward(m, fn, report):
            report.add(label)


def fused_if(ok: Callable, **options) -> Callable:
    """Decorator of a fused block forward for :func:`bind_forwards`: ``fused(self, *args,
    **kwargs, **options)`` where ``ok(self, *args, **kwargs)`` holds (``ok`` takes the
    forward's parameters by the model's names), else the block class's own forward on the
    same arguments -- the model's code, as the fused forwards are bound on exact classes
    only."""

    def wrap(fused: Callable) -> Callable:
        run = functools.partial(fused, **options) if options else fused

        @functools.wraps(fused)
        def forward(self, *args, **kwargs):
            if ok(self, *args, **kwargs):
                return run(self, *args, **kwargs)
            return type(self).forward(self, *args, **kwargs)

        return forward

    return wrap


def grad_needed(*tensors) -> bool:
    """True when autograd would need gradients through these tensors (the fused kernels
    are inference-only, so the original code runs)."""
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors
    )


def params_need_grad(module) -> bool:
    return torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters())


def needs_grad(module, *tensors) -> bool:
    """:func:`grad_needed` of ``tensors`` or :func:`params_need_grad` of ``module``, the
    fallback check of the patched processors and block forwards."""
    return torch.is_grad_enabled() and (
        any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)
        or any(p.requires_grad for p in module.parameters())
    )


def norms_ok(*modules) -> bool:
    """Whether ``qk_norm_rope`` reads every one of these norm modules (``None`` and
    ``Identity``: no norm) exactly as the model computes it (``norms.norm_readable``)."""
    return all(norm_readable(m) for m in modules)
