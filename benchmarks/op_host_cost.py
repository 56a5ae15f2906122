"""Host cost of one qk_norm_rope call (CPU, the kernel launch stubbed): the eager public
function, the ditfuse op (``ditfuse/_library.py``: registered with the dispatcher directly)
and the same body behind ``torch.library.custom_op`` (how the ops were registered before
session 4). What a compiled graph pays per op on top of Triton's launcher.

usage: python benchmarks/op_host_cost.py"""
import time
from typing import List, Optional

import torch
import triton.runtime.interpreter as interp
from torch import Tensor

import ditfuse
from ditfuse import _ops
from ditfuse.qk_norm_rope import plan, run
from ditfuse.shapes import QK_SHAPES
from ditfuse.workloads import qk_inputs

interp.InterpretedFunction.__getitem__ = lambda self, grid: (lambda *a, **k: None)


@torch.library.custom_op("ditfuse_bench::qk_norm_rope", mutates_args=())
def _custom(q: Tensor, k: Optional[Tensor], cos: Optional[Tensor], sin: Optional[Tensor],
            positions: Optional[Tensor],
            q_weight: Optional[Tensor], q_bias: Optional[Tensor], q_alpha_t: Optional[Tensor],
            q_kind: int, q_eps: float, q_size: int, q_alpha: float, q_pre: bool,
            k_weight: Optional[Tensor], k_bias: Optional[Tensor], k_alpha_t: Optional[Tensor],
            k_kind: int, k_eps: float, k_size: int, k_alpha: float, k_pre: bool,
            num_heads: int, rope_style: str, rotary_dim: int, round_after_norm: bool,
            layout: str) -> List[Tensor]:
    kw = _ops._kwargs(positions, (q_weight, q_bias, q_alpha_t, q_kind, q_eps, q_size, q_alpha,
                                  q_pre),
                      (k_weight, k_bias, k_alpha_t, k_kind, k_eps, k_size, k_alpha, k_pre),
                      num_heads, rope_style, rotary_dim, round_after_norm, layout)
    qo, ko = run(plan(q, k, cos, sin, **kw), q, k, inplace=False)
    return [qo] if ko is None else [qo, ko]


def us(fn, n=500):
    fn()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n * 1e6


with torch.no_grad():
    inp = qk_inputs(QK_SHAPES["flux1-1024"].small(8), "cpu", torch.bfloat16)
    kw = dict(inp["kwargs"], q_norm=inp["q_norm"], k_norm=inp["k_norm"])
    q, k, c, s = inp["q"], inp["k"], inp["cos"], inp["sin"]
    args = _ops.op_args(q, k, c, s, q_norm=kw["q_norm"], k_norm=kw["k_norm"],
                        num_heads=kw.get("num_heads"), rope_style=kw.get("rope_style", "interleaved"),
                        rotary_dim=kw.get("rotary_dim"), positions=None, round_after_norm=True,
                        layout=kw.get("layout", "bshd"))
    for _ in range(2):  # interleaved rounds
        print(f"eager public call        {us(lambda: ditfuse.qk_norm_rope(q, k, c, s, **kw)):7.1f} us")
        print(f"ditfuse op (_library)    {us(lambda: torch.ops.ditfuse.qk_norm_rope(*args)):7.1f} us")
        print(f"same body as custom_op   {us(lambda: torch.ops.ditfuse_bench.qk_norm_rope(*args)):7.1f} us")
