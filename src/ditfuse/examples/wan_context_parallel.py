"""Sequence (context) parallel Wan with ditfuse patched in, through diffusers' own CP hooks.

    # GPUs (NCCL); the CPU (gloo)
    torchrun --nproc-per-node 2 -m ditfuse.examples.wan_context_parallel
    torchrun --nproc-per-node 2 -m ditfuse.examples.wan_context_parallel --tiny --mode both

Every rank builds the same model and inputs (random weights, broadcast from rank 0) and
computes the one-process output of the patched model. Then a fresh copy is patched
(``ditfuse.patch``), given ``enable_parallelism(config=ContextParallelConfig(ulysses_degree=
world))`` (or ``ring_degree``), and run: diffusers splits the tokens and the RoPE tables
(``WanTransformer3DModel._cp_plan``: ``rope`` outputs and ``blocks.0`` input along the
sequence) and gathers ``proj_out``. Rank 0 prints the max |diff| and PSNR against the
one-process output (and the same for the unpatched model: the rounding diffusers' CP brings
by itself) and, on CUDA, the step time on one process vs ``world`` processes, patched and
unpatched. Exit status 1 if a diff exceeds the tolerance or ditfuse's processors are not
the ones holding the CP config.

On CUDA: Wan2.x-14B at real size (40 heads x 128, dim 5120), ``--layers`` blocks, 480p
(S = 21 * 30 * 52 = 32,760 tokens, 512 text tokens). ``--tiny`` (always on CPU): the tiny
Wan of ``ditfuse.tools.tiny_models``.

Attention backends (diffusers 0.42.1): Ulysses runs on ``native`` (SDPA). Ring attention
merges per-chunk results by their log-sum-exp, which ``native`` refuses to return; on CUDA
ring uses ``_native_cudnn`` (bf16/fp16 only), on CPU no diffusers backend returns it, so
:func:`cpu_workarounds` lends ``native`` ATen's CPU flash kernel for that one op.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import inspect
import math
import os
import statistics
import sys
import warnings

import torch
import torch.distributed as dist

PROCESSORS = "attention processors (QK-norm + RoPE)"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--mode", choices=["ulysses", "ring", "both"], default="ulysses")
    ap.add_argument("--tiny", action="store_true", help="tiny Wan config (implied on CPU)")
    ap.add_argument(
        "--layers", type=int, default=2, help="blocks of the real-size model (default 2)"
    )
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument(
        "--iters", type=int, default=5, help="timed iterations on CUDA (after 2 warm-up)"
    )
    ap.add_argument("--out", default=None, help="also write the summary to this file")
    return ap.parse_args(argv)


def setup_dist():
    """Init the default process group from torchrun's environment unless already done;
    returns (rank, world, device)."""
    cuda = torch.cuda.is_available()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        return rank, dist.get_world_size(), torch.device("cuda", torch.cuda.current_device())
    return rank, dist.get_world_size(), torch.device("cpu")


def build(tiny: bool, layers: int, dtype: torch.dtype, device):
    """The (unpatched) model and its forward kwargs, identical on every rank."""
    from ditfuse.tools import tiny_models as tm

    if tiny:
        model, kw = tm._wan(), tm._wan_inputs(torch.float32)
    else:
        from ditfuse.tools.e2e import _randomize, _wan14b, _wan_inputs

        model, kw = _randomize(_wan14b(layers)), _wan_inputs("cpu", torch.float32)
    model = tm.to_dtype(model.to(device), dtype).eval().requires_grad_(False)
    kw = {
        k: (
            v.to(device, dtype)
            if torch.is_tensor(v) and v.is_floating_point() and k != "timestep"
            else v.to(device)
            if torch.is_tensor(v)
            else v
        )
        for k, v in kw.items()
    }
    # seeded identically already; the broadcast makes "same on every rank" a fact
    for t in [
        *model.parameters(),
        *model.buffers(),
        *(v for v in kw.values() if torch.is_tensor(v)),
    ]:
        dist.broadcast(t.data, 0)
    return model, kw


def attention_backend(mode: str, device, dtype) -> str:
    """A diffusers backend that supports ``mode`` (``_supports_context_parallel``)."""
    if mode == "ring" and device.type == "cuda":
        # ring needs each chunk's log-sum-exp: native refuses it; cuDNN (and flash) give it
        if dtype != torch.bfloat16:
            raise SystemExit(
                "ring on CUDA: diffusers' LSE backends (_native_cudnn, _native_flash) "
                "are bf16/fp16 only; use --dtype bf16"
            )
        return "_native_cudnn"
    return "native"


@contextlib.contextmanager
def cpu_workarounds(device, ring_lse: bool = True):
    """What diffusers 0.42.1's context parallelism lacks on CPU, for the duration.

    * ``ModelMixin._resolve_parallel_config`` takes ``rank % torch.accelerator.device_count()``,
      which is 0 on a CPU-only build: ZeroDivisionError. Count the CPU as one device.
    * ``TemplatedRingAttention`` asks ``forward_op`` for each chunk's log-sum-exp; the native
      op raises "Native attention does not support return_lse=True" and every backend that
      returns it needs CUDA. With ``ring_lse``, the native op returns it through ATen's CPU
      flash kernel (the one SDPA runs on CPU); the ring, its all-gather of K/V and the LSE
      merge stay diffusers' own.

    A no-op on CUDA.
    """
    if device.type != "cpu":
        yield
        return
    from diffusers.models import attention_dispatch as ad

    orig_count, orig_op = torch.accelerator.device_count, ad._native_attention_forward_op
    native = inspect.signature(orig_op)

    def forward_op(*args, **kwargs):
        bound = native.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments  # the native op's arguments, by its own names
        if not a["return_lse"]:
            return orig_op(*args, **kwargs)
        q, k, v = (a[n].transpose(1, 2) for n in ("query", "key", "value"))  # (B, H, S, D)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, a["dropout_p"], a["is_causal"], attn_mask=a["attn_mask"], scale=a["scale"]
        )
        return out.transpose(1, 2), lse.transpose(1, 2)  # (B, S, H, D), (B, S, H)

    torch.accelerator.device_count = lambda: max(orig_count(), 1)
    if ring_lse:
        ad._native_attention_forward_op = forward_op
    try:
        yield
    finally:
        torch.accelerator.device_count, ad._native_attention_forward_op = orig_count, orig_op


def _cp_logger_warning_once():
    """diffusers' CP split hook warns through ``logger.warning_once`` when an input is not
    split (Wan's plan lists a 2-D per-token ``timestep``; T2V passes a 1-D one), a method
    only ``transformers`` adds to ``logging.Logger``; without it the forward fails with
    AttributeError. Give the hook's logger one."""
    from diffusers.hooks import context_parallel as cp

    if not hasattr(cp.logger, "warning_once"):
        cp.logger.warning_once = functools.lru_cache(None)(cp.logger.warning)


def enable_cp(model, mode: str, world: int, backend: str):
    from diffusers import ContextParallelConfig

    _cp_logger_warning_once()
    model.set_attention_backend(backend)
    model.enable_parallelism(config=ContextParallelConfig(**{f"{mode}_degree": world}))
    return model


def compare(out, ref):
    """(max |out - ref|, max |ref|, PSNR in dB against max |ref|, share bitwise equal)."""
    from ditfuse.tools.e2e import psnr

    d = out.double() - ref.double()
    return (
        d.abs().max().item(),
        ref.double().abs().max().item(),
        psnr(out, ref),
        (out == ref).float().mean().item(),
    )


def step_ms(model, kw, iters: int, warmup: int = 2):
    """Median forward time over ``iters`` CUDA-event timings, ranks started together."""
    times = []
    for i in range(warmup + iters):
        dist.barrier()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        model(**kw)
        e.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(s.elapsed_time(e))
    return statistics.median(times)


def _allmax(*xs, device):
    t = torch.tensor(xs, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


@torch.no_grad()
def run_mode(base, kw, mode: str, world: int, device, dtype, iters: int = 5, ring_lse: bool = True):
    """One-process vs ``mode`` parallel output of the patched model, the same for the
    unpatched model (the rounding diffusers' CP brings by itself), and on CUDA the times.

    Returns a dict: diffs reduced over ranks (the worst rank), the patch report and its
    counts, and the (class, has a CP config) pairs of this rank's self-attention processors.
    """
    import ditfuse

    cuda = device.type == "cuda"
    backend = attention_backend(mode, device, dtype)
    res = {}
    for patched in (True, False):
        model = copy.deepcopy(base)
        if patched:
            ditfuse.patch(model)
        model.set_attention_backend(backend)
        ref = model(**kw)[0]
        t1 = step_ms(model, kw, iters) if cuda else math.nan
        model = copy.deepcopy(base)
        if patched:  # before enable_parallelism: the CP config then lands on ditfuse's processors
            report = ditfuse.patch(model)
        with cpu_workarounds(device, ring_lse):
            enable_cp(model, mode, world, backend)
            out = model(**kw)[0]
            tn = step_ms(model, kw, iters) if cuda else math.nan
        if patched:
            procs = sorted(
                {
                    (
                        type(b.attn1.processor).__name__,
                        b.attn1.processor._parallel_config is not None,
                    )
                    for b in model.blocks
                }
            )
        del model
        err, scale, psnr, share = compare(out, ref)
        err, neg_psnr, neg_share, t1, tn = _allmax(err, -psnr, -share, t1, tn, device=device)
        res[patched] = {
            "err": err,
            "scale": scale,
            "psnr": -neg_psnr,
            "share": -neg_share,
            "ms_1": t1,
            "ms_n": tn,
        }
        if cuda:
            torch.cuda.empty_cache()
    r = dict(res[True], unpatched=res[False])
    S = out.shape[2] * out.shape[3] * out.shape[4] // math.prod(base.config.patch_size)
    # the gathered output against the one-process output: max |diff| relative to max |ref|,
    # and (bf16) a PSNR floor
    from ditfuse.tolerances import CONTEXT_PARALLEL as REL_TOL
    from ditfuse.tolerances import CONTEXT_PARALLEL_MIN_PSNR as MIN_PSNR

    r["ok"] = (
        r["err"] <= REL_TOL[dtype] * r["scale"]
        and r["psnr"] >= (MIN_PSNR[dtype] or -math.inf)
        and report.counts.get(PROCESSORS, 0) == 2 * len(base.blocks)
        and procs == [("DitfuseWanAttnProcessor", True)]
    )
    shim = device.type == "cpu" and mode == "ring" and ring_lse
    return dict(
        r,
        mode=mode,
        world=world,
        S=S,
        backend=backend + (" + CPU LSE op" if shim else ""),
        report=str(report),
        counts=dict(report.counts),
        processors=procs,
    )


def summary(r: dict, dtype, layers: int) -> str:
    """The lines rank 0 prints for one mode."""
    from ditfuse.tolerances import CONTEXT_PARALLEL as REL_TOL
    from ditfuse.tolerances import CONTEXT_PARALLEL_MIN_PSNR as MIN_PSNR

    u, w = r["unpatched"], r["world"]
    psnr_tol = f", PSNR >= {MIN_PSNR[dtype]:g} dB" if MIN_PSNR[dtype] else ""
    lines = [
        f"{r['mode']}: world {w}, S={r['S']} tokens, {layers} blocks, {str(dtype)[6:]}, "
        f"backend {r['backend']}",
        f"  patch: {r['report']}; self-attention processors (class, has CP config): "
        f"{r['processors']}",
        (
            f"  patched:   max |{w} processes - 1| = {r['err']:.3g} (max |ref| {r['scale']:.3g}), "
            f"PSNR {r['psnr']:.1f} dB, {100 * r['share']:.1f}% bitwise "
            f"[tolerance: <= {REL_TOL[dtype]:g} * max|ref|{psnr_tol}]"
        ),
        (
            f"  unpatched: max |{w} processes - 1| = {u['err']:.3g}, PSNR {u['psnr']:.1f} dB, "
            f"{100 * u['share']:.1f}% bitwise (diffusers' CP alone)"
        ),
    ]
    if not math.isnan(r["ms_n"]):
        lines.append(
            f"  step: patched {r['ms_1']:.1f} ms on 1 process, {r['ms_n']:.1f} ms on {w}; "
            f"unpatched {u['ms_1']:.1f} ms on 1, {u['ms_n']:.1f} ms on {w}"
        )
    lines.append(f"  {'OK' if r['ok'] else 'FAIL'}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before ditfuse imports triton
    warnings.filterwarnings("ignore", message=".*all_gather_tensor.*deprecated")
    rank, world, device = setup_dist()
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    modes = ["ulysses", "ring"] if args.mode == "both" else [args.mode]
    if world < 2:
        raise SystemExit(
            "context parallelism needs at least 2 processes (torchrun --nproc-per-node 2)"
        )
    for mode in modes:  # refuse an unsupported combination before building anything
        attention_backend(mode, device, dtype)
    base, kw = build(args.tiny or device.type == "cpu", args.layers, dtype, device)
    text, ok = [], True
    for mode in modes:
        r = run_mode(base, kw, mode, world, device, dtype, args.iters)
        ok &= r["ok"]
        text.append(summary(r, dtype, len(base.blocks)))
        if rank == 0:
            print(text[-1], flush=True)
    if rank == 0 and args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(text) + "\n")
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
