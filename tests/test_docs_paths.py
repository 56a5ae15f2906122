"""Every path, module, switch and commit the docs and the source name exists.

Scanned: README.md, CONTRIBUTING.md, docs/**/*.md and src/**/*.py (comments, docstrings and
code alike). Named there and checked here:

* repository paths (``src/...``, ``tests/...``, ``docs/...``, ``benchmarks/...``, ``.ci/...``),
  package paths (``ditfuse/...``, ``kernels/...``, ``ops/...``, ``runtime/...``, ``tools/...``,
  ``patching/...``, ``aot/...``, ``examples/...``: under src/ditfuse) -- a placeholder
  (``<gpu>``, ``{date}``, ``*``) matches any name -- and markdown links with their anchors;
* dotted modules ``ditfuse.a.b`` and the name after the module (``ditfuse.ops.adaln.x``:
  ``x`` defined in ops/adaln.py);
* switches: a ``DITFUSE_*`` environment variable, or a name the docs call a switch
  (``switch `NAME```), is read by the code (a string or a name in src/ or tests/, not a
  comment or docstring);
* commits and revisions (``git show REV:path``, a commit hash in the docs, ``tag `NAME```)
  resolve in the repository's history (checked where the tree has its history: a copy of the
  working tree without .git has nothing to resolve them against).

Each test fails listing every miss as ``file:line: name``.
"""

from __future__ import annotations

import ast
import glob
import re
import subprocess
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PKG = SRC / "ditfuse"

DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
SOURCES = sorted(PKG.rglob("*.py"))
SCANNED = DOCS + SOURCES

REPO_ROOTS = ("src", "tests", "docs", "benchmarks", ".ci")
PKG_ROOTS = ("ditfuse", "kernels", "ops", "runtime", "tools", "patching", "aot", "examples")
#: a path: one of the roots, a slash, then path characters (placeholders <x>, {x}, * kept);
#: not inside another path, a URL, a revision (``REV:path``) or a variable (``$OUT/...``)
PATH = re.compile(
    r"(?<![\w./\-:~$])((?:"
    + "|".join(re.escape(r) for r in REPO_ROOTS + PKG_ROOTS)
    + r")/[\w.\-/<>{}*]*)"
)
#: suffixes of files; a last part with another suffix is ``module.attribute``
FILE_SUFFIXES = {
    ".py",
    ".md",
    ".csv",
    ".log",
    ".txt",
    ".sh",
    ".png",
    ".json",
    ".toml",
    ".cfg",
    ".yaml",
    ".yml",
    ".h",
    ".c",
    ".cu",
    ".so",
    ".whl",
    ".tar",
    ".gz",
}
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
MODULE = re.compile(r"(?<![\w.])(ditfuse(?:\.\w+)+)")
ENV_SWITCH = re.compile(r"\bDITFUSE_[A-Z0-9_]+")
NAMED_SWITCH = re.compile(r"\bswitch(?:es)?\s+`([^`]+)`")
GIT_SHOW = re.compile(r"git show ([\w.\-/]+):([\w.\-/]+)")
TAG = re.compile(r"\btag\s+`([^`]+)`")
COMMIT = re.compile(r"(?<![\w.\-/:#])([0-9a-f]{7,40})(?![\w\-])")


def _lines(path: Path):
    for i, line in enumerate(path.read_text().splitlines(), 1):
        yield i, line


def _where(path: Path, i: int) -> str:
    return f"{path.relative_to(ROOT)}:{i}"


def _fail(misses, what):
    assert not misses, f"{len(misses)} {what} that do not exist:\n" + "\n".join(misses)


# --------------------------------------------------------------------------------------
# paths and links


def _resolve(p: str) -> str:
    """A named path as a repository path (package paths under src/ditfuse)."""
    head = p.split("/", 1)[0]
    if head == "ditfuse":
        return "src/" + p
    if head in PKG_ROOTS:
        return "src/ditfuse/" + p
    return p


def path_exists(p: str) -> bool:
    last = p.rstrip("/").rsplit("/", 1)[-1]
    if (
        "." in last.lstrip(".")
        and "<" not in last
        and "{" not in last
        and Path(last).suffix not in FILE_SUFFIXES
    ):  # module.attribute: the module's file
        p = p[: len(p) - len(last)] + last.split(".")[0] + ".py"
    r = _resolve(p)
    pattern = re.sub(r"<[^>]*>|\{[^}]*\}", "*", r)
    if "*" in pattern:
        return bool(glob.glob(str(ROOT / pattern)))
    return (ROOT / r).exists()


def named_paths():
    for f in SCANNED:
        for i, line in _lines(f):
            for m in PATH.finditer(line):
                yield _where(f, i), m.group(1).rstrip(".,;:")


def test_named_paths_exist():
    misses = [f"{w}: {p}" for w, p in named_paths() if not path_exists(p)]
    _fail(misses, "named paths")


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset:
    out, fence = set(), False
    for _, line in _lines(path):
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            out.add(_slug(line.lstrip("#")))
    return frozenset(out)


def test_markdown_links_resolve():
    misses = []
    for f in DOCS:
        for i, line in _lines(f):
            for m in LINK.finditer(line):
                target = m.group(1)
                if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                    continue
                file, _, anchor = target.partition("#")
                dest = (f.parent / file).resolve() if file else f
                if not dest.exists():
                    misses.append(f"{_where(f, i)}: {target}")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    misses.append(f"{_where(f, i)}: {target} (no heading #{anchor})")
    _fail(misses, "link targets")


# --------------------------------------------------------------------------------------
# modules


def _module_files() -> dict:
    mods = {}
    for path in SOURCES:
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = path
    return mods


MODULES = _module_files()


@lru_cache(maxsize=None)
def defined_names(mod: str) -> frozenset:
    """Names a module defines or imports at any level (functions, classes, assignments,
    imports), and its submodules."""
    names = {m[len(mod) + 1 :].split(".")[0] for m in MODULES if m.startswith(mod + ".")}
    for node in ast.walk(ast.parse(MODULES[mod].read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(e.id for e in ast.walk(t) if isinstance(e, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def module_exists(dotted: str) -> bool:
    parts = dotted.split(".")
    k = len(parts)
    while k > 1 and ".".join(parts[:k]) not in MODULES:
        k -= 1
    mod, rest = ".".join(parts[:k]), parts[k:]
    return not rest or rest[0] in defined_names(mod)


def test_named_modules_exist():
    misses = [
        f"{_where(f, i)}: {m.group(1)}"
        for f in SCANNED
        for i, line in _lines(f)
        for m in MODULE.finditer(line)
        if not module_exists(m.group(1))
    ]
    _fail(misses, "named modules or module attributes")


# --------------------------------------------------------------------------------------
# switches


@lru_cache(maxsize=None)
def _code_words(path: Path) -> str:
    """The strings (not docstrings) and names of a Python file's code, one a line."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                docstrings.add(id(body[0].value))
    words = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            words.append(node.value)
        elif isinstance(node, ast.Name):
            words.append(node.id)
        elif isinstance(node, ast.Attribute):
            words.append(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            words.append(node.name)
        elif isinstance(node, ast.keyword) and node.arg:
            words.append(node.arg)
    return "\n".join(words)


CODE_FILES = SOURCES + [
    f for f in sorted((ROOT / "tests").rglob("*.py")) if f.name != Path(__file__).name
]


@lru_cache(maxsize=None)
def in_code(name: str) -> bool:
    """``name`` is in a string or a name of the code of src/ or tests/ (this file aside)."""
    return any(name in _code_words(f) for f in CODE_FILES if name in f.read_text())


def test_named_switches_exist():
    misses = []
    for f in SCANNED:
        for i, line in _lines(f):
            names = ENV_SWITCH.findall(line) + NAMED_SWITCH.findall(line)
            misses += [f"{_where(f, i)}: {n}" for n in names if not in_code(n)]
    _fail(misses, "named switches")


# --------------------------------------------------------------------------------------
# commits, revisions and tags


def _git(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


@lru_cache(maxsize=None)
def has_history() -> bool:
    """The tree is a clone with its whole history (not a copy without .git, not shallow)."""
    if not (ROOT / ".git").exists():
        return False
    try:
        r = _git("rev-parse", "--is-shallow-repository")
    except OSError:  # no git
        return False
    return r.returncode == 0 and r.stdout.strip() == "false"


def named_revisions():
    """(where, rev, path or None) of each commit, revision or tag the docs and source name."""
    for f in SCANNED:
        for i, line in _lines(f):
            for m in GIT_SHOW.finditer(line):
                yield _where(f, i), m.group(1), m.group(2)
            for m in TAG.finditer(line):
                yield _where(f, i), m.group(1), None
            if f.suffix == ".md":
                for m in COMMIT.finditer(line):
                    h = m.group(1)
                    if re.search(r"[a-f]", h) and re.search(r"[0-9]", h):
                        yield _where(f, i), h, None


def test_named_commits_and_tags_exist():
    revs = list(named_revisions())
    assert any(rev == "abc6a90" for _, rev, _ in revs)  # the scan sees the notebook's commit
    if not has_history():
        return
    misses = []
    for where, rev, path in revs:
        obj = f"{rev}:{path}" if path else f"{rev}^{{commit}}"
        if _git("cat-file", "-e", obj).returncode != 0:
            misses.append(f"{where}: {obj}")
    _fail(misses, "named commits, revisions or tags")


# --------------------------------------------------------------------------------------
# the checks themselves


def test_checks_see_misses():
    assert not path_exists("benchmarks/flat_sweep.py") and path_exists("benchmarks/gpu_run.sh")
    assert path_exists("benchmarks/results/<gpu>-<date>.csv") and path_exists("ops/adaln.py")
    assert path_exists("tools/shapes.py") and not path_exists("kernels/nothing.py")
    assert path_exists("ops/adaln.launch_settings") and path_exists("tests/test_*_fuzz.py")
    assert [p for _, p in named_paths()]
    assert module_exists("ditfuse.tolerances.TWO_ROUNDINGS") and module_exists("ditfuse.ops")
    assert not module_exists("ditfuse.tolerances.NOTHING") and not module_exists("ditfuse.x")
    assert in_code("DITFUSE_FUZZ_N") and in_code("DITFUSE_AOT_NO_CUDA_H")
    assert not in_code("GLUON_SM90") and not in_code("DITFUSE_NOTHING")
    assert ENV_SWITCH.findall("set DITFUSE_TEST_SEED=1") == ["DITFUSE_TEST_SEED"]
    assert NAMED_SWITCH.findall("(switch `GLUON_SM90`)") == ["GLUON_SM90"]
    assert TAG.findall("git tag `notebook-2026-12-04`") == ["notebook-2026-12-04"]
    assert _slug(" The copy ceiling at FLUX sizes") == "the-copy-ceiling-at-flux-sizes"
    assert _slug("Measured (H200)") == "measured-h200"
    assert PATH.findall("see `git show abc6a90:benchmarks/NOTES.md`, $OUT/tools/x") == []
