"""The cached repeat launch (GPU only): same bits as Triton's own launcher, and a new
specialization when alignment or an int's class changes."""
import pytest
import torch

import ditfuse
from ditfuse import NormSpec, _launch
from conftest import rope_tables

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="launch cache is GPU-only")


@torch.no_grad()
def test_repeat_launch_matches_reference_across_alignments():
    H, D, S = 6, 128, 33
    g = torch.Generator(device="cuda").manual_seed(0)
    norm = NormSpec("rms", weight=torch.randn(D, device="cuda", generator=g).bfloat16(), eps=1e-6)
    cos, sin = rope_tables(S, D, device="cuda")
    _launch._CACHE.clear()
    for offset in (0, 0, 1, 1, 8, 0):  # offset 1 breaks 16-byte alignment of q and k
        buf = torch.randn(2 * S * H * D + offset, device="cuda", generator=g).bfloat16()
        q = buf[offset: offset + S * H * D].view(1, S, H, D)
        k = buf[offset + S * H * D: offset + 2 * S * H * D].view(1, S, H, D)
        out = ditfuse.qk_norm_rope(q, k, cos, sin, q_norm=norm, k_norm=norm)
        ref = ditfuse.qk_norm_rope_reference(q, k, cos, sin, q_norm=norm, k_norm=norm)
        for o, r in zip(out, ref):
            assert (o.float() - r.float()).abs().max().item() <= 2 ** -6 * r.float().abs().max().item()
    assert len(_launch._CACHE) >= 3  # aligned, misaligned, offset 8 (16-byte aligned again or not)
