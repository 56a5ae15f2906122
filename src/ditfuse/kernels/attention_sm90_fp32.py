"""SAME-L's differential band attention in fp32 on Hopper, written in Gluon (private;
routed by :func:`ditfuse.ops.attention.launch`; design and measurements:
docs/design/attention.md).

The fp32 launches of :mod:`ditfuse.kernels.attention_sm90`'s kernel (read its docstring
first; fp32 descriptors compile its ``TF32`` path), with their own settings: one
warpgroup a 64-query tile, 32-key tiles, Q1 / Q2 and every key tile of the program's
band copied by TMA before the first trip, the score products as tf32 wgmma read straight
from shared memory (both operands K-major: Q's and K's channels are contiguous). P @ V is
where fp32 differs: tf32 wgmma takes its B operand only K-major (PTX: the transposed
shared-memory layouts are for 16-bit types), and V's tile is [keys, channels] with the
channels contiguous, so each trip copies V's tile through registers into ``vt``,
[channels, keys] with the keys contiguous, while the score products run. A trip over key tile t:

    wait for K1, K2 of tile t; issue S1 = Q1 K1^T, S2 = Q2 K2^T     (async)
    wait for V of tile t; V -> registers; block barrier (the last trip's P @ V is done in
        every warp: vt is free); registers -> vt (transposed); fence; block barrier
    wait until 1 group is in flight -> S1 is done
    softmax 1 (while S2 runs); O1 *= alpha1; issue O1 += P1 V
    wait until 1 group is in flight -> S2 is done
    softmax 2 (while O1 runs); O2 *= alpha2; issue O2 += P2 V
    wait for both P @ V (nothing in flight across the back edge: ``attention_sm90``)

Shared memory at SAME-L's 3 key tiles: Q1 / Q2 32 KB, K1 / K2 / V 72 KB, vt 8 KB (112 KB: 2
programs an SM; the output's layout change reuses dead buffers). Faster than the Triton
entry at the TensorRT contract shape; a second vt buffer (1 program an SM) and a 72 KB form
with one K buffer and a two-deep V ring (3 programs an SM, its refills exposed) were slower
(the measurements: docs/design/attention.md).

Contract: fp32 in and out, tensor-core products at tf32 operand precision (as the Triton
kernel's ``tl.dot``), fp32 softmax and accumulation; within ``ACCURACY[fp32]``
of the fp64 formula, as every fp32 launch. Not bitwise the Triton fp32 entry: that one tiles
32 queries on mma.sync with 16-key tiles, so its running maxima, the tf32 rounding of its
probabilities and its sums differ (|difference| ~ 6e-4 on unit-variance inputs at SAME-L).

Scope (``attention.gluon_ok``): sm_90, differential, fp32, head_dim 64, no prologue, the
table's narrow-band fp32 entry (at most 4 key tiles a program), every operand's channels
contiguous and its strides and base 16-byte aligned; any other call runs the Triton kernel.
"""

from __future__ import annotations

from ditfuse.kernels.attention_sm90 import (
    _swa_diff_sm90_kernel,
    descriptor,  # noqa: F401  (the launcher's, by module)
)
from ditfuse.kernels.attention_sm90 import max_trips as _max_trips

BLOCK_M = 64
BLOCK_N = 32
NUM_WARPS = 4
#: ptxas's register cap: 168 keeps the kernel free of spills inside its loop (179 uncapped)
#: and leaves shared memory as the bound (2 programs an SM at SAME-L's 3 key tiles)
MAXNREG = 168


def max_trips(N: int, left: int, right: int, step: int) -> int:
    """``attention_sm90.max_trips`` for this kernel's key tiles."""
    return _max_trips(N, left, right, step, BLOCK_N)


#: the kernel of :mod:`ditfuse.kernels.attention_sm90`, which takes fp32 descriptors this way
_swa_diff_fp32_sm90_kernel = _swa_diff_sm90_kernel
