"""Shared test settings: tolerances written once, input builders, poisoned outputs."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("PYTEST_XDIST_WORKER"):  # one process a core: no thread pool fighting it
    torch.set_num_threads(1)

import ditfuse  # noqa: E402,F401  (imported after the interpreter is set up)
from ditfuse.tolerances import TWO_ROUNDINGS  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
#: DITFUSE_TEST_SEED=n draws other rotary tables (0, the default, is what CI runs): a claim
#: of equal bits that holds for one draw only shows up under other seeds
SEED = int(os.environ.get("DITFUSE_TEST_SEED", "0"))

#: two roundings of the activation dtype (``ditfuse.tolerances.TWO_ROUNDINGS``) as
#: ``assert_close``'s keywords
TOL = {dtype: tol._asdict() for dtype, tol in TWO_ROUNDINGS.items()}
DTYPES = [torch.bfloat16, torch.float16, torch.float32]

#: randomized cases in the default tier; the rest of ``DITFUSE_FUZZ_N`` carry the ``slow`` mark
FUZZ_FAST = int(os.environ.get("DITFUSE_FUZZ_FAST", "4"))


def fuzz_cases(n: int):
    """Case numbers 0..n-1 as parameters: the first ``FUZZ_FAST`` in the default tier, the
    others in the slow tier (``pytest -m slow``). A case draws the same inputs whichever tier
    runs it."""
    return [
        pytest.param(i, id=f"case{i}", marks=() if i < FUZZ_FAST else pytest.mark.slow)
        for i in range(n)
    ]


def assert_close_report(out, ref, dtype, what=""):
    """Within one rounding of ``dtype``; returns the share of bitwise-equal elements."""
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert out.dtype == ref.dtype, (out.dtype, ref.dtype)
    tol = dict(TOL[dtype])
    # a tie flipped at the intermediate rounding moves the result by up to an ulp of the
    # normalised input, whatever the size of the (possibly cancelled) result
    tol["atol"] = max(tol["atol"], tol["rtol"] * ref.float().pow(2).mean().sqrt().item())
    torch.testing.assert_close(out.float(), ref.float(), **tol, msg=lambda m: f"{what}: {m}")
    return (out == ref).float().mean().item()


@pytest.fixture(autouse=True)
def _seed_per_test(request):
    """The global generator seeded from the test's id (and ``SEED``): a test draws the same
    inputs (and a tiny model the same weights) whichever tests ran before it."""
    import zlib

    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()) + SEED * 1000003)
    yield


@pytest.fixture
def exact_interpreter_dots(monkeypatch):
    """Interpreter dots (``tl.dot``) summed in fp64, then rounded once to the accumulator's
    dtype. Triton's interpreter takes a dot with numpy's matmul in the accumulator's dtype,
    whose summation order is the host BLAS's: OpenBLAS picks its kernel per CPU, and on
    some hosts (seen: an AMD EPYC on OpenBLAS's Haswell kernels) a [32, 16] x [16, 32]
    product sums a column in another order than [32, 16] x [16, 64] does. A test that
    compares tiles of two shapes bit for bit takes this fixture, so that its claim -- the
    same products and sums a column -- does not depend on the host. The operands (bf16,
    fp16, fp32 truncated to tf32) have <= 11-bit significands: every product is exact in
    fp64, and a column's sum of K <= 128 of them too unless they spread over ~30 binades
    (then fp64's own rounding could still flip an fp32 rounding: ~2^-29 an element)."""
    if DEVICE != "cpu":
        return
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    plain = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.data.dtype != np.float32 or b.data.dtype != np.float32 or d.data.dtype != np.float32:
            return plain(self, a, b, d, input_precision, max_num_imprecise_acc)
        prod = np.matmul(a.data.astype(np.float64), b.data.astype(np.float64))
        return interpreter.TensorHandle(prod.astype(np.float32) + d.data, d.dtype.scalar)

    monkeypatch.setattr(builder, "create_dot", create_dot)


@pytest.fixture
def poison_outputs(monkeypatch):
    """Make every output ditfuse allocates start as NaN, so an unwritten element fails."""
    import sys

    mod = sys.modules["ditfuse.ops.qk_norm_rope"]

    def _nan_like(x, p):
        return torch.full(x.shape, float("nan"), dtype=x.dtype, device=x.device)

    monkeypatch.setattr(mod, "_out_like", _nan_like)
    yield


def rope_tables(
    S, W, dtype=torch.float32, style="interleaved", unique=False, device=DEVICE, base=10000.0
):
    """cos/sin as diffusers builds them: repeat-interleaved ('interleaved') or cat-duplicated
    ('half'); ``unique`` gives the W/2 unique frequencies only."""
    half = W // 2
    inv = 1.0 / base ** (torch.arange(half, dtype=torch.float64) * 2 / W)
    # a random phase a row, from a generator of the call's own: the same table whatever ran
    # before (the global generator made a test's inputs depend on the tests run before it)
    g = torch.Generator().manual_seed(S * 4099 + W + SEED * 1000003)
    phase = torch.rand(S, 1, dtype=torch.float64, generator=g)
    ang = torch.arange(S, dtype=torch.float64)[:, None] * inv[None] + phase
    c, s = ang.cos(), ang.sin()
    if not unique:
        if style == "interleaved":
            c, s = c.repeat_interleave(2, -1), s.repeat_interleave(2, -1)
        else:
            c, s = torch.cat((c, c), -1), torch.cat((s, s), -1)
    return c.to(dtype).to(device), s.to(dtype).to(device)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Of a parametrized test's cases that are not marked ``slow``, the default tier runs every
    other one (the first, the third, ...) where there are two or more; the slow tier runs the
    others; the cases of ``tests/heavy_tier.txt`` are marked ``heavy`` (and ``slow``), which
    CI leaves out. Runs before ``-m`` selects, on every xdist worker alike (collection order
    is fixed)."""
    groups: dict = {}
    for item in items:
        if getattr(item, "callspec", None) is None or item.get_closest_marker("slow"):
            continue
        groups.setdefault((str(item.path), item.originalname), []).append(item)
    for cases in groups.values():
        if len(cases) >= 2:
            for c in cases[1::2]:
                c.add_marker(pytest.mark.slow)
    # after the split above, so that the default tier's cases do not move
    heavy = heavy_tier()
    for item in items:
        if item.nodeid.removeprefix("tests/") in heavy:
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.heavy)


def heavy_tier() -> set:
    """The node ids of ``tests/heavy_tier.txt`` (relative to tests/)."""
    path = os.path.join(os.path.dirname(__file__), "heavy_tier.txt")
    with open(path) as f:
        return {ln.strip() for ln in f if ln.strip() and not ln.startswith("#")}
