"""Launch an AOT package without Triton: ``ditfuse.aot.load(DIR)(*tensors)``.

The package (``kernel.ptx``, ``kernel.cubin``, ``manifest.json``, written by
``ditfuse export``) is loaded with the CUDA driver API of cuda-python
(``cuda.bindings.driver``: cuModuleLoadData, cuModuleGetFunction, cuLaunchKernel) and
launched on torch tensors with exactly the arguments TensorRT passes: the input pointers,
then the INT32 extras, then the output pointers. Nothing here imports Triton or the rest of
ditfuse, so this file works on its own: ``ditfuse export`` writes a copy of it into every
package as ``ditfuse_aot_loader.py`` (the package's README.txt says how to use it). It needs
torch, and to launch (not to ``bind``) a GPU with its driver and cuda-python; without them
a launch raises :class:`NoGPUError` saying what is missing. (``import ditfuse.aot.loader``
itself runs ``ditfuse/__init__.py``, which imports the ops and Triton: where ditfuse is
installed that is fine, elsewhere use the copy.)

>>> k = load("wan_qk")                        # ditfuse export qk_norm_rope -o wan_qk
>>> k(qkv, cos, sin, q_weight, k_weight)      # in place: qkv_out is qkv
>>> k.bind(qkv, cos, sin, q_weight, k_weight).grid   # (B * N, 2, 1): no GPU needed

``bind`` checks every tensor against the manifest (dtype, shape with its symbols B / N,
the contiguous layout the strides were compiled for, 16-byte alignment, the in-place
aliasing) and evaluates the grid and the extras; it needs no GPU. Launches go to torch's
current stream, so they can be captured in a CUDA graph.
"""

from __future__ import annotations

import ast
import ctypes
import hashlib
import json
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence, Tuple

FORMAT = "ditfuse-aot/1"
ALIGN = 16  # bytes every pointer must be aligned to (the PTX declares .align 16)


# ---------------------------------------------------------------------------------------
# grid / extra formulas: "B * N", "cdiv(N, 64)", "1"

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
}


def _cdiv(a, b):
    """ceil(a / b) of ints or TensorRT's symbolic sizes (this file imports no Triton)."""
    return -(-a // b)


def eval_formula(expr: str, env: Dict[str, Any], cdiv: Callable = _cdiv):
    """Evaluate a manifest formula: ints, names from ``env``, ``+ - * //`` and ``cdiv``.

    The operators are applied to whatever ``env`` holds, so the same formula gives an int
    (the loader), a TensorRT symbolic expression (the plugin) or, through
    :func:`formula_to_c`, a C expression (the header).
    """

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise KeyError(f"formula {expr!r} uses {node.id!r}, not among {sorted(env)}")
            return env[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "cdiv"
            and len(node.args) == 2
            and not node.keywords
        ):
            return cdiv(ev(node.args[0]), ev(node.args[1]))
        raise ValueError(f"unsupported formula {expr!r} (ints, names, + - * // and cdiv only)")

    return ev(ast.parse(str(expr), mode="eval"))


def formula_names(expr: str) -> List[str]:
    return sorted(
        {
            n.id
            for n in ast.walk(ast.parse(str(expr), mode="eval"))
            if isinstance(n, ast.Name) and n.id != "cdiv"
        }
    )


# ---------------------------------------------------------------------------------------
# the package

_TORCH_DTYPES = {
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
    "int32": "int32",
    "int64": "int64",
}


def _torch_dtype(name: str):
    import torch

    return getattr(torch, _TORCH_DTYPES[name])


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Launch:
    """Everything one launch needs: grid, block, dynamic shared memory, and the kernel's
    arguments in its parameter order (pointers as ints, extras as ints)."""

    grid: Tuple[int, int, int]
    block: Tuple[int, int, int]
    shared_mem: int
    args: List[Tuple[str, str, int]]  # (name, "ptr" | "i32", value)
    symbols: Dict[str, int]
    outputs: List[Any] = field(default_factory=list)
    device: Any = None

    def ctypes_args(self):
        """(keep-alive list, void** array) for cuLaunchKernel."""
        vals = [
            ctypes.c_uint64(v) if kind == "ptr" else ctypes.c_int32(v) for _, kind, v in self.args
        ]
        arr = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        return vals, arr


class Package:
    """A loaded AOT package. Call it with the runtime tensors (inputs, then outputs; an
    output that aliases an input, or that is omitted, is filled in)."""

    def __init__(self, path, image: str = "auto", verify: bool = True):
        if image not in ("auto", "ptx", "cubin"):
            raise ValueError(f"image must be 'auto', 'ptx' or 'cubin', got {image!r}")
        self.path = Path(path)
        mpath = self.path / "manifest.json"
        if not mpath.is_file():
            raise FileNotFoundError(
                f"{mpath} not found: is {self.path} a ditfuse AOT package "
                "(ditfuse export ... -o DIR)?"
            )
        self.manifest = m = json.loads(mpath.read_text())
        if m.get("format") != FORMAT:
            raise ValueError(f"{mpath}: format {m.get('format')!r}, this loader reads {FORMAT!r}")
        self.image = image
        self.ptx = (self.path / m["files"]["ptx"]).read_bytes()
        self.cubin = (self.path / m["files"]["cubin"]).read_bytes()
        if verify:
            for kind, data in (("ptx", self.ptx), ("cubin", self.cubin)):
                if _sha256(data) != m["sha256"][kind]:
                    raise ValueError(
                        f"{self.path / m['files'][kind]}: sha256 differs from the "
                        "manifest (the file was changed after export)"
                    )
        self.params: List[Dict] = m["parameters"]
        self.tensor_params = [p for p in self.params if p["kind"] != "extra"]
        self._functions: Dict[int, Any] = {}

    # --- description ----------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.manifest["entry"]

    @property
    def inputs(self) -> List[str]:
        return [p["name"] for p in self.params if p["kind"] == "input"]

    @property
    def outputs(self) -> List[str]:
        return [p["name"] for p in self.params if p["kind"] == "output"]

    @property
    def extras(self) -> List[str]:
        return [p["name"] for p in self.params if p["kind"] == "extra"]

    def __repr__(self):
        sig = ", ".join(f"{p['name']}: {p['kind']} {p['dtype']}" for p in self.params)
        return f"<ditfuse AOT {self.manifest['op']} {self.name}({sig}) {self.manifest['target']}>"

    # --- binding (no GPU needed) ----------------------------------------------------
    def _gather(self, tensors: Sequence[Any], named: Dict[str, Any]) -> Dict[str, Any]:
        names = [p["name"] for p in self.tensor_params]
        if len(tensors) > len(names):
            raise TypeError(
                f"{self.name} takes at most {len(names)} tensors ({', '.join(names)}), "
                f"got {len(tensors)}"
            )
        got = dict(zip(names, tensors))
        for k, v in named.items():
            if k not in names:
                raise TypeError(f"unknown tensor {k!r}; this package takes {', '.join(names)}")
            if k in got:
                raise TypeError(f"{k} given twice")
            got[k] = v
        missing = [n for n in self.inputs if n not in got]
        if missing:
            raise TypeError(f"{self.name} needs the input(s) {', '.join(missing)}")
        return got

    def bind(self, *tensors, **named) -> Launch:
        """Check the tensors against the manifest; the launch they make (no GPU needed)."""
        import torch

        got = self._gather(tensors, named)
        syms: Dict[str, int] = {}
        # symbols from the inputs' shapes (the manifest says which dim is which)
        for p in self.params:
            if p["kind"] != "input":
                continue
            t = got[p["name"]]
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{p['name']} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() != len(p["shape"]):
                raise ValueError(
                    f"{p['name']} must be {len(p['shape'])}-D {tuple(p['shape'])}, "
                    f"got shape {tuple(t.shape)}"
                )
            for d, s in zip(t.shape, p["shape"]):
                if isinstance(s, str):
                    syms.setdefault(s, int(d))
        device = got[self.inputs[0]].device
        outputs = []
        for p in self.params:
            if p["kind"] != "output":
                continue
            t = got.get(p["name"])
            if t is None:
                if p.get("aliases"):
                    t = got[p["aliases"]]
                else:
                    shape = [syms[s] if isinstance(s, str) else s for s in p["shape"]]
                    t = torch.empty(shape, dtype=_torch_dtype(p["dtype"]), device=device)
                got[p["name"]] = t
            outputs.append(t)
        for p in self.tensor_params:
            self._check_tensor(p, got[p["name"]], syms, device)
        for p in self.tensor_params:
            if p.get("aliases") and got[p["name"]].data_ptr() != got[p["aliases"]].data_ptr():
                raise ValueError(
                    f"{p['name']} must be the same memory as {p['aliases']} (the "
                    f"kernel updates it in place and writes only part of it)"
                )
        args = []
        for p in self.params:
            if p["kind"] == "extra":
                v = int(eval_formula(p["value"], syms))
                if not -(2**31) <= v < 2**31:
                    raise ValueError(
                        f"extra {p['name']} = {v} does not fit the INT32 the kernel takes"
                    )
                args.append((p["name"], "i32", v))
            else:
                args.append((p["name"], "ptr", int(got[p["name"]].data_ptr())))
        m = self.manifest
        grid = tuple(int(eval_formula(g, syms)) for g in m["grid"])
        if not (0 <= grid[0] < 2**31 and 0 <= grid[1] < 65536 and 0 <= grid[2] < 65536):
            raise ValueError(f"grid {grid} exceeds CUDA's limits")
        return Launch(grid, tuple(m["block"]), int(m["shared_mem"]), args, syms, outputs, device)

    def _check_tensor(self, p, t, syms, device):
        import torch

        name = p["name"]
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        want_dt = _torch_dtype(p["dtype"])
        if t.dtype != want_dt:
            raise TypeError(
                f"{name}.dtype must be {want_dt} (the package is compiled for it), got {t.dtype}"
            )
        shape = [syms.get(s) if isinstance(s, str) else s for s in p["shape"]]
        if list(t.shape) != shape:
            raise ValueError(
                f"{name} must have shape {tuple(p['shape'])} = {tuple(shape)}, got {tuple(t.shape)}"
            )
        # the strides are compile-time constants of the package: the contiguous layout
        stride, want = 1, []
        for d in reversed(shape):
            want.append(stride)
            stride *= d
        want = want[::-1]
        bad = [i for i, (s, w, d) in enumerate(zip(t.stride(), want, shape)) if d > 1 and s != w]
        if bad:
            raise ValueError(
                f"{name} must be contiguous (strides {tuple(want)}; the package's "
                f"strides are compile-time constants), got strides {t.stride()}"
            )
        if t.device != device:
            raise ValueError(f"{name} is on {t.device}, {self.inputs[0]} on {device}")
        if t.numel() and t.data_ptr() % ALIGN:
            raise ValueError(
                f"{name} must be {ALIGN}-byte aligned (the kernel was compiled for "
                f"it and uses vector loads), got address {t.data_ptr():#x}"
            )

    # --- launching (GPU, cuda-python) -----------------------------------------------
    def require_gpu(self, device=None) -> None:
        """Raise :class:`NoGPUError`, saying what is missing, unless this process can launch
        the package: a CUDA build of torch that sees a GPU of the package's architecture
        (and its driver), ``device`` (the tensors') a CUDA device, and cuda-python."""
        import torch

        target = self.manifest["target"]
        cap = _capability(target)
        gpu = (
            f"an NVIDIA GPU of compute capability {cap[0]}.{cap[1]}"
            + ("" if target.endswith("a") else " or newer")
            + " with its CUDA driver"
        )
        need = (
            f"Launching {self.name} ({target}) needs {gpu}, a CUDA build of torch and "
            f"cuda-python (pip install cuda-python"
            f"{'' if _have_driver_module() else '; not installed here either'})"
        )
        hint = (
            "Without a GPU, Package.bind(*tensors) still checks the tensors and computes "
            "the grid and the kernel's arguments."
        )
        if not torch.cuda.is_available():
            why = (
                "torch was built without CUDA"
                if torch.version.cuda is None
                else "torch finds no CUDA device (no GPU, or no NVIDIA driver loaded)"
            )
            raise NoGPUError(f"no CUDA driver / GPU is available here: {why}. {need}. {hint}")
        if device is not None and getattr(device, "type", "cuda") != "cuda":
            raise NoGPUError(
                f"the tensors are on {device}: a package launches on CUDA tensors "
                f"(torch sees {torch.cuda.device_count()} GPU(s)). {hint}"
            )
        idx = (
            device.index
            if device is not None and device.index is not None
            else torch.cuda.current_device()
        )
        have = torch.cuda.get_device_capability(idx)
        if have < cap or (target.endswith("a") and have != cap):
            raise NoGPUError(
                f"GPU {idx} ({torch.cuda.get_device_name(idx)}) has compute "
                f"capability {have[0]}.{have[1]}; {need}."
            )
        _driver()

    def _function(self, device):
        import torch

        idx = device.index if device.index is not None else torch.cuda.current_device()
        if idx in self._functions:
            return self._functions[idx]
        drv = _driver()
        torch.cuda.set_device(idx)
        torch.cuda.init()
        torch.cuda.current_stream(idx)  # torch makes its primary context current
        _check(drv, drv.cuInit(0))
        err, ctx = drv.cuCtxGetCurrent()
        _check(drv, (err,))
        if not int(ctx):
            err, dev = drv.cuDeviceGet(idx)
            _check(drv, (err,))
            err, ctx = drv.cuDevicePrimaryCtxRetain(dev)
            _check(drv, (err,))
            _check(drv, drv.cuCtxSetCurrent(ctx))
        image = self._image_for(torch.cuda.get_device_capability(idx))
        buf = ctypes.create_string_buffer(image, len(image) + 1)
        err, module = drv.cuModuleLoadData(ctypes.addressof(buf))
        _check(drv, (err,), f"cuModuleLoadData({'PTX' if image is self.ptx else 'cubin'})")
        err, fn = drv.cuModuleGetFunction(module, self.name.encode())
        _check(drv, (err,), f"cuModuleGetFunction({self.name})")
        smem = int(self.manifest["shared_mem"])
        if smem > 48 * 1024:
            attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _check(drv, drv.cuFuncSetAttribute(fn, attr, smem))
        self._functions[idx] = (module, fn, buf)
        return self._functions[idx]

    def _image_for(self, capability) -> bytes:
        """The cubin when it was built for exactly this GPU's architecture, else the PTX
        (the driver JIT-compiles it, as TensorRT does)."""
        if self.image == "ptx":
            return self.ptx
        tgt = self.manifest["target"].rstrip("a")
        same = tgt == f"sm_{capability[0]}{capability[1]}"
        if self.image == "cubin":
            if not same:
                raise RuntimeError(
                    f"the cubin is for {self.manifest['target']}, this GPU is "
                    f"sm_{capability[0]}{capability[1]}: use image='ptx'"
                )
            return self.cubin
        return self.cubin if same else self.ptx

    def launch(self, launch: Launch, stream=None) -> None:
        import torch

        self.require_gpu(launch.device)
        if 0 in launch.grid:
            return
        drv = _driver()
        _, fn, _ = self._function(launch.device)
        if stream is None:
            stream = torch.cuda.current_stream(launch.device).cuda_stream
        elif hasattr(stream, "cuda_stream"):
            stream = stream.cuda_stream
        keep, arr = launch.ctypes_args()
        gx, gy, gz = launch.grid
        bx, by, bz = launch.block
        _check(
            drv,
            drv.cuLaunchKernel(
                fn,
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                launch.shared_mem,
                drv.CUstream(int(stream)),
                ctypes.addressof(arr),
                0,
            ),
            f"cuLaunchKernel({self.name})",
        )
        del keep

    def __call__(self, *tensors, stream=None, **named):
        """Launch on ``tensors`` (inputs, then outputs); returns the output tensor(s)."""
        b = self.bind(*tensors, **named)
        self.launch(b, stream)
        return b.outputs[0] if len(b.outputs) == 1 else tuple(b.outputs)


class NoGPUError(RuntimeError):
    """This process cannot launch a package: no usable GPU, driver or cuda-python."""


def _capability(target: str) -> Tuple[int, int]:
    """The compute capability of a target: sm_90a -> (9, 0)."""
    digits = target[3:].rstrip("a")
    return int(digits[:-1]), int(digits[-1])


def _have_driver_module() -> bool:
    import importlib.util

    for name in ("cuda.bindings", "cuda"):
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except (ImportError, ValueError):
            pass
    return False


def _driver():
    try:
        from cuda.bindings import driver
    except ImportError:
        try:  # cuda-python < 12.6
            from cuda import cuda as driver
        except ImportError:
            raise ImportError(
                "launching an AOT package needs cuda-python (pip install "
                "cuda-python; from cuda.bindings import driver), besides a GPU "
                "with its CUDA driver"
            ) from None
    return driver


def _check(drv, ret, what: str = "CUDA driver call"):
    err = ret[0] if isinstance(ret, tuple) else ret
    if int(err) != 0:
        _, msg = drv.cuGetErrorString(err)
        raise RuntimeError(f"{what} failed: {err} ({msg.decode() if msg else '?'})")


def load(path, image: str = "auto", verify: bool = True) -> Package:
    """Load the package in ``path`` (``manifest.json``, ``kernel.ptx``, ``kernel.cubin``).

    ``image``: ``"auto"`` runs the cubin when it was built for the GPU's exact architecture
    and the PTX otherwise; ``"ptx"`` always JIT-compiles the PTX (what TensorRT does);
    ``"cubin"`` insists on the cubin. ``verify`` checks the files' sha256 against the
    manifest. Nothing touches the GPU until the first launch.
    """
    return Package(path, image=image, verify=verify)
