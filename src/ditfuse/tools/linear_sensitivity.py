"""``ditfuse bench --e2e --linear-sensitivity``: how much each class of block linear costs in
FP8, measured on a model (the evidence behind ``linear_exclude``'s default).

For one model of :data:`ditfuse.tools.e2e.E2E_MODELS` (eager, the model's dtype):

- **ways**: a ``steps``-step Euler trajectory and one step's output of the model patched with
  ``attention="fp8"``, ``linear="fp8"``, both, and ``linear="fp8"`` restricted to one class of
  block linear at a time (the name after the block index, Q / K / V together since they fuse;
  then the first and the last block alone), each against the unpatched model: trajectory PSNR
  and max |diff|, the step's cosine and relative L2;
- **layers**: inside the model patched with ``linear="fp8"``, each FP8 linear's output against
  the 16-bit linear (the weight ``unpatch`` restores) on the same input -- the error of that
  layer alone on the activations it really sees (an FFN's output projection with its GELU).
"""

from __future__ import annotations

import copy
import datetime
import fnmatch
import os
import re
import time
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

from ditfuse.tolerances import cos_rel

ROW_FIELDS = [
    "model",
    "kind",
    "name",
    "linears",
    "psnr",
    "max_abs_diff",
    "cos",
    "rel_l2",
    "note",
]

_QKV = re.compile(r"\.(to_[qkv]|add_[qkv]_proj)$")


def _block_place(name: str):
    """``("blocks", 3, "attn1.to_q")`` for ``blocks.3.attn1.to_q``; None outside the blocks."""
    parts = name.split(".")
    if len(parts) < 3 or "blocks" not in parts[0] or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1]), ".".join(parts[2:])


def linear_classes(model: torch.nn.Module, exclude) -> Dict[str, List[str]]:
    """{class: block linear names} over the linears ``patch(linear="fp8")`` would take (not
    matching ``exclude``): by the name within the block, Q / K / V (and the added Q / K / V)
    one class since they fuse; then "first block" and "last block" (of the first and the
    last block list)."""
    classes: Dict[str, List[str]] = {}
    places = []
    for name, m in model.named_modules():
        place = _block_place(name)
        if type(m) is not torch.nn.Linear or place is None:
            continue
        if any(fnmatch.fnmatchcase(name, p) for p in exclude):
            continue
        places.append((name, place))
        key = _QKV.sub(lambda g: "." + re.sub(r"[qkv]", "q/k/v", g.group(1), count=1), name)
        key = ".".join(key.split(".")[2:])
        classes.setdefault(f"{place[0]}: {key}", []).append(name)
    if places:
        lists = sorted({p[0] for _, p in places})
        first = min(p[1] for _, p in places if p[0] == lists[0])
        last = max(p[1] for _, p in places if p[0] == lists[-1])
        classes["first block"] = [n for n, p in places if p[:2] == (lists[0], first)]
        classes["last block"] = [n for n, p in places if p[:2] == (lists[-1], last)]
    return classes


def only(model: torch.nn.Module, names, exclude) -> tuple:
    """The ``linear_exclude`` that leaves exactly ``names`` (of the FP8-eligible block
    linears) to ``patch(linear="fp8")``."""
    keep = set(names)
    rest = [
        n
        for n, m in model.named_modules()
        if type(m) is torch.nn.Linear and _block_place(n) is not None and n not in keep
    ]
    return tuple(exclude) + tuple(rest)


def layer_accuracy(model: torch.nn.Module, kw: dict) -> List[tuple]:
    """(name, cos, rel L2) of each FP8 linear of a ``patch(linear="fp8")``-ed ``model`` in
    one forward of ``kw``: its output against ``F.linear`` of the same input with its 16-bit
    weight; an FFN whose GELU runs in the quantizing pass against ``F.linear(gelu(h))`` of the
    same ``h``."""
    from ditfuse.patching import linear_fp8 as L

    rows, hooks, hidden = [], [], {}

    def w16(m):
        return m.__dict__[L._W16].to(m._ditfuse_w8.device)

    def linear_hook(name):
        def hook(m, args, out):
            ref = F.linear(args[0], w16(m), m.bias)
            rows.append((name, *cos_rel(out, ref)))

        return hook

    def keep_hidden(name):
        def hook(m, args, out):
            hidden[name] = out

        return hook

    def ffn_hook(name):
        def hook(m, args, out):
            proj = m.net[-1]
            x = F.gelu(hidden.pop(name), approximate="tanh")
            ref = F.linear(x, w16(proj), proj.bias)
            rows.append((f"{name}.net.2 (GELU fused)", *cos_rel(out, ref)))

        return hook

    for name, m in model.named_modules():
        if m.__dict__.get(L._FFN):
            hooks.append(m.net[0].proj.register_forward_hook(keep_hidden(name)))
            hooks.append(m.register_forward_hook(ffn_hook(name)))
        elif getattr(m, "_ditfuse_w8", None) is not None and L._W16 in m.__dict__:
            hooks.append(m.register_forward_hook(linear_hook(name)))
    try:
        with torch.no_grad():
            model(**kw)
    finally:
        for h in hooks:
            h.remove()
    return rows


def run_sensitivity(
    spec,
    device: str,
    layers: int,
    emit: Callable[[dict], None],
    steps: int = 20,
    config=None,
    sizes=None,
    progress: Callable[[str], None] = lambda line: None,
    dtype: torch.dtype = torch.bfloat16,
) -> None:
    """The rows of the module docstring for ``spec`` (an :class:`~ditfuse.tools.e2e.E2EModel`)
    with ``layers`` blocks, eager; ``config`` / ``sizes`` override the model's (tests)."""
    import ditfuse
    from ditfuse.patching.linear_fp8 import DEFAULT_EXCLUDE
    from ditfuse.tools import e2e

    model = e2e.build_model(spec, layers, device, dtype, **(config or {}))
    kw = spec.inputs(device, dtype, cfg=model.config, **(spec.sizes if sizes is None else sizes))
    with torch.no_grad():
        ref = e2e.trajectory(model, kw, spec, steps)
        ref1 = model(**kw)[0]

    def row(kind, name, linears="", **kv):
        r = dict.fromkeys(ROW_FIELDS)
        r.update(model=spec.name, kind=kind, name=name, linears=linears, **kv)
        emit(r)

    classes = linear_classes(model, DEFAULT_EXCLUDE)
    ways = [
        ("attention fp8", lambda m: ditfuse.patch(m, attention="fp8"), ""),
        ("linear fp8", lambda m: ditfuse.patch(m, linear="fp8"), "all"),
        (
            "attention fp8 + linear fp8",
            lambda m: ditfuse.patch(m, attention="fp8", linear="fp8"),
            "all",
        ),
    ]
    for label, names in classes.items():
        excl = only(model, names, DEFAULT_EXCLUDE)
        ways.append(
            (
                f"linear fp8: {label}",
                lambda m, excl=excl: ditfuse.patch(m, linear="fp8", linear_exclude=excl),
                str(len(names)),
            )
        )
    for label, fn, count in ways:
        t0 = time.time()
        m = copy.deepcopy(model)
        fn(m)
        with torch.no_grad():
            traj = e2e.trajectory(m, kw, spec, steps)
            cos, rel = cos_rel(m(**kw)[0], ref1)
        row(
            "way",
            label,
            count,
            psnr=e2e.psnr(traj, ref),
            max_abs_diff=(traj.float() - ref.float()).abs().max().item(),
            cos=cos,
            rel_l2=rel,
            note=f"{steps}-step trajectory and one step vs unpatched eager",
        )
        progress(f"  {label}: {time.time() - t0:.0f} s")
        del m
    m = copy.deepcopy(model)
    ditfuse.patch(m, linear="fp8")
    for name, cos, rel in layer_accuracy(m, kw):
        row("layer", name, "1", cos=cos, rel_l2=rel, note="vs the 16-bit linear, same input")


def main(args) -> int:
    """``ditfuse bench --e2e --linear-sensitivity [--models M] [--layers N] [--steps S]``: the
    rows printed and written to ``<out-dir>/e2e-linear-sensitivity-<GPU>-<date>.csv``."""
    from ditfuse.tools import e2e

    prog = "ditfuse bench --e2e --linear-sensitivity"
    names = e2e.models_to_run(args.models, ["wan14b-480p"], prog, transformers_only=True)
    if names is None:
        return 2
    out_dir = getattr(args, "out_dir", None) or "benchmarks/results"
    os.makedirs(out_dir, exist_ok=True)
    gpu = torch.cuda.get_device_name()
    path = os.path.join(
        out_dir,
        f"e2e-linear-sensitivity-{gpu.replace(' ', '-')}-{datetime.date.today().isoformat()}.csv",
    )
    rows = []

    def emit(r):
        rows.append(r)
        cells = [f"{r[k]:.6g}" if isinstance(r[k], float) else str(r[k] or "") for k in ROW_FIELDS]
        print("  ".join(cells), flush=True)
        e2e.write_csv(path, rows, ROW_FIELDS)

    print(f"{gpu}, torch {torch.__version__}; eager, bf16; " + "  ".join(ROW_FIELDS), flush=True)
    for n in names:
        layers = args.layers or e2e.FP8_LAYERS.get(n, 2)
        run_sensitivity(
            e2e.E2E_MODELS[n],
            "cuda",
            layers,
            emit,
            steps=args.steps,
            progress=lambda line: print(line, flush=True),
        )
    print(f"csv: {path}", flush=True)
    return 0
