"""The package's layers import downward only, and no module imports itself back.

    runtime, norms, reference, tolerances, _version
                                          (leaves: where kernels run, norm specs, references,
                                          the contracts' tolerances)
    kernels                               (@triton.jit / Gluon code)
    ops                                   (plan, settings, launch, public function, op + fake)
    patching | aot                        (diffusers integration | ahead-of-time packages)
    ditfuse (the public API)
    tools, examples, __main__             (cli, check, bench, e2e, inspect, shapes, workloads)

Every import counts, also the ones inside functions: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "ditfuse"

LAYERS = [  # (module prefix, layer); the longest matching prefix wins
    ("ditfuse._version", 0),
    ("ditfuse.runtime", 0),
    ("ditfuse.norms", 0),
    ("ditfuse.reference", 0),
    ("ditfuse.tolerances", 0),
    ("ditfuse.kernels", 1),
    ("ditfuse.ops", 2),
    ("ditfuse.patching", 3),
    ("ditfuse.aot", 3),
    ("ditfuse", 4),  # the package root: the public API
    ("ditfuse.tools", 5),
    ("ditfuse.examples", 5),
    ("ditfuse.__main__", 5),
]


def _modules() -> dict:
    mods = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def layer(mod: str) -> int:
    best = max((p for p, _ in LAYERS if mod == p or mod.startswith(p + ".")), key=len)
    return dict(LAYERS)[best]


def group(mod: str) -> str:
    """The package a module belongs to: patching and aot share a layer and do not import each
    other."""
    best = max((p for p, _ in LAYERS if mod == p or mod.startswith(p + ".")), key=len)
    return best


def _resolve(mod: str, node: ast.ImportFrom, is_pkg: bool) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(mod: str) -> set:
    """Every ditfuse module ``mod`` imports, at module level or inside a function."""
    path = MODULES[mod]
    tree = ast.parse(path.read_text(), str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(mod, node, path.name == "__init__.py")
            names = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
        else:
            continue
        for n in names:
            if n == "ditfuse" or n.startswith("ditfuse."):
                while n not in MODULES:  # an attribute path: its module
                    n = n.rsplit(".", 1)[0]
                if n != mod:
                    out.add(n)
    return out


GRAPH = {m: imports(m) for m in MODULES}


def test_every_module_has_a_layer():
    assert {layer(m) for m in MODULES} <= set(dict(LAYERS).values())
    assert "ditfuse.kernels.qk_token" in MODULES and "ditfuse.ops.attention" in MODULES


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_imports_point_down(mod):
    bad = []
    for t in sorted(GRAPH[mod]):
        if layer(t) > layer(mod):
            bad.append(f"{t} (layer {layer(t)}) is above {mod} (layer {layer(mod)})")
        elif layer(t) == layer(mod) == 3 and group(t) != group(mod):
            bad.append(f"{t} sits beside {mod} (layer {layer(mod)}), in another package")
    assert not bad, "\n".join(bad)


def test_reference_imports_no_op():
    assert not {t for t in GRAPH["ditfuse.reference"] if layer(t) > 0}


def test_tolerances_import_nothing_of_ditfuse():
    """The tolerances are read by the references, the tests and ``ditfuse check``: a leaf
    that imports no other ditfuse module."""
    assert GRAPH["ditfuse.tolerances"] == set()


def test_no_import_cycles():
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_checker_sees_a_violation(tmp_path):
    """The walk above finds lazy (in-function) imports: a kernel module importing an op
    from inside a function is reported."""
    src = "def f():\n    from ditfuse.ops import attention\n    return attention\n"
    mod = "ditfuse.kernels.qk_token"
    saved = MODULES[mod]
    fake = tmp_path / "qk_token.py"
    fake.write_text(src)
    MODULES[mod] = fake
    try:
        found = imports(mod)
    finally:
        MODULES[mod] = saved
    assert "ditfuse.ops.attention" in found and layer("ditfuse.ops.attention") > layer(mod)
