"""TensorRT plugins for ditfuse AOT packages (``tensorrt.plugin``, TensorRT >= 10.9).

Import this module only where TensorRT is installed (it imports ``tensorrt`` at the top;
nothing else in ditfuse does). :func:`register` turns one package written by ``ditfuse
export`` into a TensorRT "quickly deployable plugin":

* ``trtp.register`` -- output descriptors from the manifest (an in-place output is
  ``inp.aliased()``, the others ``inp.like()`` with the manifest's dtype and shape);
* ``trtp.autotune`` -- the one dtype combination and the linear format the package takes;
* ``trtp.aot_impl`` -- the package's PTX (already rewritten for TensorRT: scratch
  parameters stripped, ``.target sm_90``, pointer alignment), the launch parameters (grid
  from the manifest's formula over the inputs' symbolic shapes, block = num_warps * 32,
  shared memory) and the INT32 extras (``N = qkv.shape[1]``). No Triton runs at build time;
  the engine holds the PTX, so it runs without Python and can be captured in a CUDA graph;
* ``trtp.impl`` -- the JIT path (TensorRT calls back into Python at enqueue): the op's own
  ditfuse function (Triton JIT) on the same tensors, for engines built without
  ``aot=True`` and as the reference the AOT path must match bitwise.

Building an engine that uses the Wan QK package::

    # once, on any machine (no GPU): ditfuse export qk_norm_rope -o wan_qk
    import numpy as np, tensorrt as trt
    from ditfuse.aot import trt_plugin

    plugin = trt_plugin.register("wan_qk")   # "ditfuse::qk_norm_rope_h40d128_bf16_all_interleaved"
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    net = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    qkv = net.add_input("qkv", trt.bfloat16, (1, -1, 3 * 5120))
    cos = net.add_input("cos", trt.float32, (1, -1, 1, 128))
    sin = net.add_input("sin", trt.float32, (1, -1, 1, 128))
    qw = net.add_input("q_weight", trt.bfloat16, (5120,))      # or add_constant(...)
    kw = net.add_input("k_weight", trt.bfloat16, (5120,))
    layer = net.add_plugin(trt_plugin.op(plugin)(qkv, cos, sin, qw, kw), aot=True)
    net.mark_output(layer.get_output(0))         # qkv, normalised and rotated in place
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    profile.set_shape("qkv", (1, 1024, 15360), (1, 32760, 15360), (1, 75600, 15360))
    for t in ("cos", "sin"):
        profile.set_shape(t, (1, 1024, 1, 128), (1, 32760, 1, 128), (1, 75600, 1, 128))
    config.add_optimization_profile(profile)
    engine = builder.build_serialized_network(net, config)   # the PTX is in the engine

(``aot=True`` asks for the AOT implementation; ``add_plugin`` with the plugin op is
TensorRT's own QDP API.) The block size is fixed by the PTX (``.reqntid``); the grid, the extras and
everything else follow from the manifest, so a package and its plugin cannot disagree.
"""

from __future__ import annotations

import re
from typing import Dict, List, Tuple

import tensorrt as trt
import tensorrt.plugin as trtp

from ditfuse.aot.loader import Package, eval_formula, load

_TRT_DT = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "int32": "int32"}
_TRT_NAME = {"bf16": "BF16", "fp16": "FP16", "fp32": "FP32", "int32": "INT32"}

#: plugin id -> Package, for everything registered in this process
REGISTERED: Dict[str, Package] = {}


def _sym_sources(m) -> Dict[str, Tuple[int, int]]:
    """symbol -> (input index, dim) from the manifest's "qkv.shape[1]"."""
    names = [p["name"] for p in m["parameters"] if p["kind"] == "input"]
    out = {}
    for s, src in m["symbols"].items():
        mm = re.fullmatch(r"(\w+)\.shape\[(\d+)\]", src)
        out[s] = (names.index(mm.group(1)), int(mm.group(2)))
    return out


def _describe(pkg: Package, descs):
    m = pkg.manifest
    ins = [p for p in m["parameters"] if p["kind"] == "input"]
    index = {p["name"]: i for i, p in enumerate(ins)}
    src = _sym_sources(m)
    outs = []
    for p in m["parameters"]:
        if p["kind"] != "output":
            continue
        if p.get("aliases"):
            outs.append(descs[index[p["aliases"]]].aliased())
            continue
        same = [i for i, q in enumerate(ins) if q["shape"] == p["shape"]]
        ref = descs[same[0] if same else 0]
        d = ref.like()
        if not same or ins[same[0]]["dtype"] != p["dtype"]:
            d.dtype = getattr(trt, _TRT_DT[p["dtype"]])
        if not same:
            dims = [
                descs[src[s][0]].shape_expr[src[s][1]] if isinstance(s, str) else s
                for s in p["shape"]
            ]
            d.shape_expr = trtp.ShapeExprs.from_tuple(tuple(dims))
        outs.append(d)
    return tuple(outs)


def _aot(pkg: Package, descs):
    m = pkg.manifest
    env = {s: descs[i].shape_expr[d] for s, (i, d) in _sym_sources(m).items()}
    launch = trtp.KernelLaunchParams()
    launch.grid_x, launch.grid_y, launch.grid_z = (
        eval_formula(g, env, cdiv=trtp.cdiv) for g in m["grid"]
    )
    launch.block_x = m["block"][0]
    launch.shared_mem = int(m["shared_mem"])
    extras = [p for p in m["parameters"] if p["kind"] == "extra"]
    args = trtp.SymIntExprs(len(extras))
    for i, p in enumerate(extras):
        args[i] = trtp.SymInt32(eval_formula(p["value"], env))
    return m["entry"], pkg.ptx.decode(), launch, args


def _jit(pkg: Package, tensors, outputs, stream) -> None:
    import torch

    from ditfuse.aot.ops import get

    m = pkg.manifest
    entry = get(m["op"])
    opts = entry.resolve(**m["options"])
    names = [p["name"] for p in m["parameters"] if p["kind"] == "input"]
    onames = [p["name"] for p in m["parameters"] if p["kind"] == "output"]
    t = {n: torch.as_tensor(x, device="cuda") for n, x in zip(names, tensors)}
    t.update({n: torch.as_tensor(x, device="cuda") for n, x in zip(onames, outputs)})
    with torch.cuda.stream(torch.cuda.ExternalStream(int(stream))):
        entry.call(opts, t)


def op(plugin_id: str):
    """``trtp.op.<namespace>.<name>``: call it with the input tensors to make a plugin."""
    ns, name = plugin_id.split("::")
    return getattr(getattr(trtp.op, ns), name)


def register(package, namespace: str = "ditfuse", name: str = None, jit_impl: bool = True) -> str:
    """Register the package in directory ``package`` as plugin ``namespace::name`` (name:
    the kernel's entry name without its ``ditfuse_`` prefix); returns the plugin id."""
    pkg = package if isinstance(package, Package) else load(package)
    m = pkg.manifest
    name = name or re.sub(r"^ditfuse_", "", m["entry"])
    pid = f"{namespace}::{name}"
    if pid in REGISTERED:
        return pid
    ins = [p["name"] for p in m["parameters"] if p["kind"] == "input"]
    n_out = sum(p["kind"] == "output" for p in m["parameters"])
    io_types = ", ".join(_TRT_NAME[p["dtype"]] for p in m["parameters"] if p["kind"] != "extra")
    desc_args = ", ".join(f"{n}: trtp.TensorDesc" for n in ins)
    tens_args = ", ".join(f"{n}: trtp.Tensor" for n in ins)
    tup = ", ".join(ins) + ("," if len(ins) == 1 else "")
    out_t = "trtp.TensorDesc" if n_out == 1 else f"Tuple[{', '.join(['trtp.TensorDesc'] * n_out)}]"
    src = f"""
from typing import List, Tuple, Union

def describe({desc_args}) -> {out_t}:
    d = _describe(_pkg, ({tup}))
    return d[0] if {n_out} == 1 else d

def autotune({desc_args}, outputs: Tuple[trtp.TensorDesc]) -> List[trtp.AutoTuneCombination]:
    return [trtp.AutoTuneCombination({io_types!r})]

def aot_impl({desc_args}, outputs: Tuple[trtp.TensorDesc], tactic: int
             ) -> Tuple[Union[str, bytes], Union[str, bytes], trtp.KernelLaunchParams,
                        trtp.SymExprs]:
    return _aot(_pkg, ({tup}))

def impl({tens_args}, outputs: Tuple[trtp.Tensor], stream: int) -> None:
    _jit(_pkg, ({tup}), outputs, stream)
"""
    ns = dict(globals(), _pkg=pkg)  # the generated functions see this module's names
    exec(compile(src, f"<ditfuse.aot.trt_plugin {pid}>", "exec"), ns)
    trtp.register(pid)(ns["describe"])
    trtp.autotune(pid)(ns["autotune"])
    trtp.aot_impl(pid)(ns["aot_impl"])
    if jit_impl:
        trtp.impl(pid)(ns["impl"])
    REGISTERED[pid] = pkg
    return pid


def register_all(packages, namespace: str = "ditfuse") -> List[str]:
    """Register several package directories; their plugin ids."""
    return [register(p, namespace) for p in packages]
