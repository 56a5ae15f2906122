"""Patched models inside a captured CUDA graph (GPU only): the graph, replayed on new inputs
copied into its static buffers, gives what the patched model computes eagerly on them.
The fused kernels take no host synchronisation and allocate nothing outside the capture's
pool, so the whole patched forward is capturable."""

import pytest
import torch

import ditfuse
from ditfuse.tools.tiny_models import CASES, to_dtype

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _to(kw, device):
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}


def _fresh_like(kw, seed):
    """New random values for every floating-point activation input (ids, timesteps and
    attention masks kept: a random "mask" is not one)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = {}
    for k, v in kw.items():
        if (
            isinstance(v, torch.Tensor)
            and v.is_floating_point()
            and v.numel() > 1
            and "mask" not in k
        ):
            out[k] = (torch.randn(v.shape, generator=g, device="cuda") * v.float().std()).to(
                v.dtype
            )
        else:
            out[k] = v
    return out


@pytest.mark.parametrize("name,make,inputs,expected", CASES, ids=[c[0] for c in CASES])
@torch.no_grad()
def test_patched_forward_in_a_cuda_graph(name, make, inputs, expected):
    if name == "qwen-image":
        pytest.skip(
            "diffusers 0.42.1's QwenImageTransformer2DModel.forward is not capturable "
            "patched or not: compute_text_seq_len_from_mask copies a CPU tensor to the GPU"
        )
    model = to_dtype(make(), torch.bfloat16).cuda()
    ditfuse.patch(model)
    static = _to(inputs(torch.bfloat16), "cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up outside the capture: kernels compiled, caches filled
        for _ in range(2):
            model(**static)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(**static)[0]
    for i in range(3):
        new = _fresh_like(static, seed=i)
        for k, v in new.items():
            if isinstance(v, torch.Tensor) and v is not static[k]:
                static[k].copy_(v)
        graph.replay()
        want = model(**new)[0]
        torch.cuda.synchronize()
        scale = want.float().abs().max().item()
        err = (out.float() - want.float()).abs().max().item()
        assert err <= 2**-7 * scale, (name, i, err, scale)
