"""``ditfuse check``'s gates of patch(attention="fp8"): the route rule (which kernel each call
must reach) and the gates on the CPU, where every call takes the Triton kernel through the
interpreter."""

import pytest
import torch

from ditfuse.tools import check as c
from ditfuse.tools import check_patch_fp8 as P


@pytest.mark.parametrize(
    "seen,calls,sm90,ok",
    [
        ([("ws", True), ("ws", True)], 2, True, True),  # unmasked calls, 16-bit Q / K
        ([("ws", True), ("triton", True)], 2, True, False),  # key-padded: the WS kernel too
        ([("ws", True), ("triton", False)], 2, True, False),  # unmasked call on Triton
        ([("ws", False)], 1, True, False),  # the WS kernel given 8-bit Q / K
        ([("ws", True)], 2, True, False),  # a call missing: the 16-bit path ran
        ([("triton", False), ("triton", True)], 2, False, True),  # the interpreter
        ([("ws", True)], 1, False, False),  # the WS kernel off sm_90
    ],
)
def test_route_rule(seen, calls, sm90, ok):
    assert P._route_ok(seen, calls, sm90) is ok


def test_planned_counts_the_rows():
    from ditfuse.tools.tiny_models import FP8_CASES

    assert P.planned(False, True) == len(FP8_CASES)
    assert P.planned(True, True) == len(FP8_CASES) - len(P._GPU_ONLY)
    assert P.planned(True, False) == 1


def test_launch_spy_restores_the_entry_points():
    from ditfuse.ops import attention_fp8

    before = attention_fp8.run_ws, attention_fp8.run
    with pytest.raises(RuntimeError):
        with P._launches():
            assert attention_fp8.run is not before[1]
            raise RuntimeError
    assert (attention_fp8.run_ws, attention_fp8.run) == before


@pytest.mark.slow
def test_gates_pass_on_the_cpu():
    pytest.importorskip("diffusers")
    if torch.cuda.is_available():
        pytest.skip("the CPU run of the gates")
    g = c.Gates(echo=False)
    P.check_gates(g, "cpu", True)
    assert len(g.rows) == P.planned(True, True)
    assert g.ok, g.table()
    assert all("Triton" in r[3] and "0 warp-specialized" in r[3] for r in g.rows), g.table()
