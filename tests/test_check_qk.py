"""``ditfuse check``'s QK gates on the CPU (small shapes): every registry shape within the
contract, the shared-table == expanded-table bitwise gate, and the tolerance's rotary-pair
magnitude (``_pair_magnitude``)."""

import pytest
import torch
from conftest import DEVICE

from ditfuse.tools import check as c


def test_pair_magnitude_interleaved_and_half():
    r = torch.randn(2, 3, 10, dtype=torch.float64)
    m = c._pair_magnitude(r, "interleaved", 8)
    for i in range(4):
        n = (r[..., 2 * i] ** 2 + r[..., 2 * i + 1] ** 2).sqrt()
        assert torch.allclose(m[..., 2 * i], n) and torch.allclose(m[..., 2 * i + 1], n)
    assert torch.equal(m[..., 8:], r[..., 8:].abs())  # pass-through channels: their own
    h = c._pair_magnitude(r, "half", 6)
    for i in range(3):
        n = (r[..., i] ** 2 + r[..., i + 3] ** 2).sqrt()
        assert torch.allclose(h[..., i], n) and torch.allclose(h[..., i + 3], n)
    assert torch.equal(h[..., 6:], r[..., 6:].abs())


def test_pair_scale_admits_a_rounding_of_the_pair_not_more():
    """A rotated element that cancels (|a| << |(a, b)|) may move by a rounding of the pair's
    magnitude (the tolerance without the pair scale rejects that); a larger move fails."""
    ref = torch.full((1, 1002), 0.1, dtype=torch.float64)
    ref[0, :2] = torch.tensor([0.01, 4.0], dtype=torch.float64)  # element 0 cancels
    ref = ref.to(torch.bfloat16).double()
    m = c._pair_magnitude(ref, "interleaved", 1002)
    moved = ref.clone()
    moved[0, 0] += 2.0**-6  # half a bf16 ulp of the pair's magnitude (4: ulp 2^-5)
    out = moved.to(torch.bfloat16)
    assert c._err(out, ref) > 1
    assert c._err(out, ref, scale=m) <= 1
    far = ref.clone()
    far[0, 0] += 0.2
    assert c._err(far.to(torch.bfloat16), ref, scale=m) > 1


@pytest.mark.slow  # the gates of `ditfuse check`, which runs them too
def test_qk_gates_small_shapes():
    g = c.Gates()
    c.qk_accuracy(g, DEVICE, True, [torch.bfloat16, torch.float32])
    c.qk_layout_bitwise(g, DEVICE, True)
    bad = [r for r in g.rows if r[2] != "PASS"]
    assert g.rows and not bad, bad
    # as many rows as ditfuse check's progress counts for these two stages
    assert len(g.rows) == len(c.QK_SHAPES) * 2 + len(c._LAYOUT_STYLES) * len(c._LAYOUT_HEADS)
