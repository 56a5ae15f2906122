"""The rotary tables the patched processors hand to qk_norm_rope (``patching.table_once``):
made once per table object and version, and Wan's arithmetic for any table (pair columns
that differ included)."""

import pytest
import torch
from conftest import DEVICE, assert_close_report

from ditfuse.patching.common import _TABLES, table_once


def test_table_once_caches_per_table_and_version():
    calls = []

    def make(t):
        calls.append(1)
        return t[..., 0::2].repeat_interleave(2, dim=-1)

    a = torch.randn(1, 5, 1, 8, device=DEVICE)
    b = a.clone()
    first = table_once(a, "t", make)
    assert table_once(a, "t", make) is first and len(calls) == 1  # the same table: cached
    assert torch.equal(first, make(a))
    calls.clear()
    other = table_once(b, "t", make)  # equal values, another tensor: its own entry
    assert other is not first and len(calls) == 1
    a.mul_(2)  # modified in place: made again, from the new values
    again = table_once(a, "t", make)
    assert again is not first and torch.equal(again, a[..., 0::2].repeat_interleave(2, dim=-1))
    assert table_once(a, "u", make) is not again  # another tag: another table
    n = len(_TABLES)
    del a, b
    keep = torch.randn(3, device=DEVICE)
    table_once(keep, "t", make)  # a miss drops the dead entries (a's two, b's one)
    assert len(_TABLES) <= n - 2
    assert all(r() is not None for r, _, _ in _TABLES.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@torch.no_grad()
def test_patched_wan_processor_any_table(dtype, monkeypatch):
    """Random (1, S, 1, D) tables whose pair columns differ: the patched processor rotates
    with cos[..., 0::2] and sin[..., 1::2] as Wan's eager processor does."""
    from diffusers.models.transformers import transformer_wan as tw

    from ditfuse.patching import wan as _wan

    calls = []
    orig = _wan.qk_norm_rope
    monkeypatch.setattr(_wan, "qk_norm_rope", lambda *a, **k: (calls.append(1), orig(*a, **k))[1])

    torch.manual_seed(3)
    B, H, D, S = 2, 3, 64, 7
    attn = tw.WanAttention(
        dim=H * D, heads=H, dim_head=D, eps=1e-6, processor=tw.WanAttnProcessor()
    ).to(DEVICE, dtype)
    for p in (attn.norm_q.weight, attn.norm_k.weight):
        p.copy_(torch.rand_like(p) + 0.5)
    cos = torch.rand(1, S, 1, D, device=DEVICE) * 2 - 1
    sin = torch.rand(1, S, 1, D, device=DEVICE) * 2 - 1
    assert not torch.equal(cos[..., 0::2], cos[..., 1::2])
    x = (torch.randn(B, S, H * D, device=DEVICE) * 2 + 0.3).to(dtype)
    want = attn(x, rotary_emb=(cos, sin))
    attn.set_processor(_wan._make_processor()())
    got = attn(x, rotary_emb=(cos, sin))
    got2 = attn(x, rotary_emb=(cos, sin))  # the cached tables
    assert torch.equal(got, got2) and len(calls) == 2  # the fused path, not the fallback
    # the attention and output projection after the rotated q / k: the same eager code
    assert_close_report(got, want, dtype, "patched Wan vs eager")
