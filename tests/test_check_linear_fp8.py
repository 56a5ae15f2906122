"""``ditfuse check``'s FP8 GEMM gates: the rows it plans, both passing on the CPU (the kernel
through the interpreter), and each failing when the kernel's output is wrong."""

import pytest
import torch

from ditfuse.ops import gemm_fp8 as G
from ditfuse.tools import check_linear_fp8 as L
from ditfuse.tools.check import Gates

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the CPU form: the kernel through the interpreter"
)


def test_gates_pass_on_the_cpu():
    g = Gates(L.planned(True), echo=False)
    L.check_gates(g, "cpu", True)
    assert len(g.rows) == L.planned(True) == 2 * len(L.SMALL_SHAPES)
    assert g.ok, g.table()
    assert "bitwise" in g.rows[1][3]


def test_gates_catch_a_wrong_kernel(monkeypatch):
    """A product off by 1% and a residual epilogue that drops the gate both fail."""
    real = G.launch_gemm_fp8_rows

    def wrong(q, s, wq, ws, b, out, residual=None, gate=None, **kw):
        if residual is None:
            real(q, s, wq, ws, b, out, **kw)
            return out.mul_(1.01)
        return real(q, s, wq, ws, b, out, residual=residual, gate=None, **kw)

    monkeypatch.setattr(G, "launch_gemm_fp8_rows", wrong)
    g = Gates(L.planned(True), echo=False)
    L.check_gates(g, "cpu", True)
    assert [r[2] for r in g.rows] == ["FAIL", "FAIL"], g.table()
