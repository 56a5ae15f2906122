"""patching.join_tokens: torch.cat along the tokens, a view (no copy) when the two parts
are adjacent token ranges of one buffer (FLUX.1's single blocks pass each other
``out[:, :T], out[:, T:]``), a real cat otherwise."""

import pytest
import torch

from ditfuse.patching.common import join_tokens


@pytest.mark.parametrize("B", [1, 3])
def test_adjacent_halves_are_joined_without_copy(B):
    g = torch.Generator().manual_seed(B)
    buf = torch.randn(B, 11, 8, generator=g).to(torch.bfloat16)
    a, b = buf[:, :4], buf[:, 4:]
    j = join_tokens(a, b)
    assert torch.equal(j, torch.cat([a, b], dim=1))
    assert (
        j.data_ptr() == buf.data_ptr()
        and j.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
    )
    assert j.shape == buf.shape and j.stride() == buf.stride()


def _cases():
    g = torch.Generator().manual_seed(0)
    buf = torch.randn(2, 11, 8, generator=g)
    yield "separate tensors", torch.randn(2, 4, 8, generator=g), torch.randn(2, 7, 8, generator=g)
    yield "swapped order", buf[:, 4:], buf[:, :4]
    yield "gap between", buf[:, :3], buf[:, 4:]
    yield "channel slices", buf[:, :4, :4], buf[:, 4:, :4]
    yield "batch rows of a wider buffer", torch.randn(2, 12, 8, generator=g)[:, :4], buf[:, 4:]
    wide = torch.randn(
        2, 12, 8, generator=g
    )  # adjacent in memory, but each batch row has 12 tokens
    yield "B > 1, rows of 12 tokens", wide[:, :4], wide[:, 4:11]
    yield "converted copies", buf[:, :4].double(), buf[:, 4:].double()


@pytest.mark.parametrize("name,a,b", list(_cases()), ids=[c[0] for c in _cases()])
def test_otherwise_a_real_cat(name, a, b):
    j = join_tokens(a, b)
    assert torch.equal(j, torch.cat([a, b], dim=1))
    assert j.untyped_storage().data_ptr() not in (
        a.untyped_storage().data_ptr(),
        b.untyped_storage().data_ptr(),
    )


def _models():
    from ditfuse.tools import tiny_models as tm

    return {
        "flux1": (tm._flux, tm._flux_inputs),  # two single blocks
        "hunyuan-video": (lambda: tm._hunyuan(single_layers=2), tm._hunyuan_inputs),
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", ["flux1", "hunyuan-video"])
@torch.no_grad()
def test_single_blocks_join_without_copy(name, monkeypatch):
    """In a patched FLUX.1 / HunyuanVideo the first single block concatenates the double
    blocks' separate outputs; every later one gets its predecessor's halves and joins them
    as a view; the output stays bitwise the unpatched one."""
    pytest.importorskip("diffusers")
    import ditfuse
    from ditfuse.patching import common as patching
    from ditfuse.tools.tiny_models import to_dtype

    make, inputs = _models()[name]
    model = to_dtype(make(), torch.bfloat16)
    kw = inputs(torch.bfloat16)
    ref = model(**kw)[0]
    ditfuse.patch(model)
    seen, real = [], patching._adjacent
    monkeypatch.setattr(patching, "_adjacent", lambda a, b: (seen.append(real(a, b)), seen[-1])[1])
    out = model(**kw)[0]
    assert seen == [False, True]
    assert torch.equal(out, ref)
