"""Host cost of one eager ditfuse call on the GPU machine, and where it goes.

For each op FLUX.1's patched blocks call (real FLUX.1 1024^2 sizes, bf16): the public call's
host time (200 calls launched back to back, no sync: the GPU work of each is shorter than
the host's, so the loop measures the host), Triton's own launch path for the same kernel
and arguments (``JITFunction.run``), the argument binder alone, the compiled kernel's C
launcher alone, and a cProfile of the public call. Two eager torch ops for scale.

usage: python benchmarks/host_cost.py [--profile]

docs/design/host_cost.md has what it measured before and after launches were replayed."""

import cProfile
import pstats
import sys
import time

import torch
import triton
from triton.runtime import driver
from triton.runtime.jit import JITFunction

import ditfuse
from ditfuse.tools.shapes import QK_SHAPES
from ditfuse.tools.workloads import qk_inputs

N = 200


def host_us(fn, n=N):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return dt


class Capture:
    """Records the last JITFunction.run call (kernel, args, grid, kwargs)."""

    def __enter__(self):
        self.orig = JITFunction.run
        cap = self

        def run(jit, *args, grid, warmup, **kwargs):
            cap.last = (jit, args, grid, dict(kwargs))
            return cap.orig(jit, *args, grid=grid, warmup=warmup, **kwargs)

        JITFunction.run = run
        return self

    def __exit__(self, *exc):
        JITFunction.run = self.orig


def pieces(fn):
    from ditfuse.runtime import fastpath

    fastpath.ENABLED = False  # a replay would not pass through JITFunction.run
    try:
        with Capture() as cap:
            fn()
    finally:
        fastpath.ENABLED = True
    jit, args, grid, kwargs = cap.last
    if callable(grid):
        grid = grid(None)
    kernel = jit.run(*args, grid=grid, warmup=False, **dict(kwargs))
    device = driver.active.get_current_device()
    binder = jit.device_caches[device][4]
    kw = dict(kwargs)
    kw.setdefault("debug", False)
    kw.setdefault("instrumentation_mode", "")
    bound, spec, opts = binder(*args, **kw)
    vals = tuple(bound.values())
    g = tuple(grid) + (1,) * (3 - len(grid))
    stream = driver.active.get_current_stream(device)

    def direct():
        kernel.run(
            g[0],
            g[1],
            g[2],
            stream,
            kernel.function,
            kernel.packed_metadata,
            None,
            None,
            None,
            *vals,
        )

    return {
        "jit.run": host_us(lambda: jit.run(*args, grid=grid, warmup=False, **dict(kwargs))),
        "binder": host_us(lambda: binder(*args, **kw)),
        "C launcher": host_us(direct),
        "n_args": len(args),
        "n_kw": len(kwargs),
        "name": jit.__name__,
    }


def main():
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    B, D = 1, 3072
    S_all = 4096 + 512  # image + text tokens
    x = torch.randn(B, S_all, D, device=dev, dtype=dt)
    y = torch.randn_like(x)
    emb = torch.randn(B, 6 * D, device=dev, dtype=dt)
    sh, sc, g, sh2, sc2, g2 = emb.chunk(6, 1)
    h = torch.randn(B, S_all, 4 * D, device=dev, dtype=dt)
    inp = qk_inputs(QK_SHAPES["flux1-1024"], dev, dt)
    kw = dict(inp["kwargs"], q_norm=inp["q_norm"], k_norm=inp["k_norm"])
    q, k, c, s = inp["q"], inp["k"], inp["cos"], inp["sin"]
    ops = {
        "adaln_modulate": lambda: ditfuse.adaln_modulate(
            x, sh, sc, norm="layer", eps=1e-6, rounding="per_op"
        ),
        "gated_residual_adaln": lambda: ditfuse.gated_residual_adaln(
            x, y, g, sh2, sc2, norm="layer", eps=1e-6, rounding="per_op"
        ),
        "gated_residual": lambda: ditfuse.gated_residual(x, y, g2, rounding="per_op"),
        "gelu": lambda: ditfuse.gelu(h, "tanh"),
        "qk_norm_rope": lambda: ditfuse.qk_norm_rope(q, k, c, s, **kw),
    }
    torch_ops = {
        "torch: x + y * g[:, None]": lambda: x + y * g[:, None],
        "torch: layer_norm": lambda: torch.nn.functional.layer_norm(x, (D,), eps=1e-6),
        "torch: empty_like": lambda: torch.empty_like(x),
    }
    print(
        f"torch {torch.__version__}, triton {triton.__version__}, "
        f"{torch.cuda.get_device_name()}; host us a call, {N} calls, no sync"
    )
    with torch.no_grad():
        for name, fn in torch_ops.items():
            print(f"{name:28s} {host_us(fn):8.1f} us", flush=True)
        for name, fn in ops.items():
            p = pieces(fn)
            print(
                f"{name:28s} {host_us(fn):8.1f} us  | {p['name']} ({p['n_args']} args + "
                f"{p['n_kw']} kw): jit.run {p['jit.run']:.1f}, binder {p['binder']:.1f}, "
                f"C launcher {p['C launcher']:.1f}",
                flush=True,
            )
        if "--profile" in sys.argv:
            for name, fn in ops.items():
                pr = cProfile.Profile()
                pr.enable()
                for _ in range(N):
                    fn()
                pr.disable()
                torch.cuda.synchronize()
                print(f"\n=== cProfile {name}, {N} calls")
                pstats.Stats(pr, stream=sys.stdout).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
