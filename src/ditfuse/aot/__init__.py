"""Ahead-of-time packages of ditfuse kernels (``ditfuse export``; ``docs/aot.md``).

A package is a folder with ``kernel.ptx``, ``kernel.cubin`` and ``manifest.json`` (entry
name, parameters in TensorRT's order -- input pointers, INT32 extras, output pointers --
with dtypes and symbolic shapes, constexprs, grid formula, block, shared memory,
registers/spills from ``ptxas -v``, target, Triton version, sha256), optionally
``kernel.h`` / ``kernel.c`` (cubin embedded, typed launch function over the driver API).

* :func:`export` -- compile one specialization on a machine with no GPU
  (``ditfuse export OP -o DIR``; ``export.py``);
* :func:`load` -- launch a package on torch tensors through cuda-python, no Triton
  (``loader.py``);
* ``ditfuse.aot.trt_plugin`` -- ``tensorrt.plugin`` registration (import it only where
  TensorRT is installed);
* ``ditfuse.aot.ptx`` -- the PTX rewrite rules and their refusals (:class:`AotRefusal`).
"""

# bound after the submodule import, so ``ditfuse.aot.export`` stays the function (the
# module is ``sys.modules["ditfuse.aot.export"]``; ``from ditfuse.aot.export import ...``)
from ditfuse.aot.export import export
from ditfuse.aot.loader import Package, load
from ditfuse.aot.ops import REGISTRY
from ditfuse.aot.ptx import AotRefusal

__all__ = ["AotRefusal", "Package", "REGISTRY", "export", "load"]
