"""``ditfuse check``: the parity gates of every op, ending in a pass/fail table.

On a GPU the gates run at the registry's production shapes; without one, through Triton's
interpreter with a few tokens per shape (same heads and head_dim). The patching gates need
diffusers (``pip install 'ditfuse[diffusers]'``); without it they are reported SKIP, not
passed.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from ditfuse import qk_norm_rope_reference
from ditfuse.norms import NormSpec
from ditfuse.ops.qk_norm_rope import qk_norm_rope
from ditfuse.runtime import backend
from ditfuse.tolerances import PATCHED_MODEL, PATCHED_VAE, TWO_ROUNDINGS
from ditfuse.tools import check_attention_fp8, check_linear_fp8, check_patch_fp8
from ditfuse.tools.check_attention import check_gates as attention_gates
from ditfuse.tools.check_group_norm import check_gates as group_norm_gates
from ditfuse.tools.shapes import QK_SHAPES
from ditfuse.tools.workloads import eager_fn, qk_inputs, rope_table

#: within two roundings of the activation dtype (``ditfuse.tolerances.TWO_ROUNDINGS``)
TOL = TWO_ROUNDINGS


def _pair_magnitude(ref: torch.Tensor, style: str, R: int) -> torch.Tensor:
    """|ref| where no rotation acts, and the magnitude of the element's rotary pair,
    sqrt(a^2 + b^2) (a rotation keeps it), over the first ``R`` channels."""
    r = ref.double()
    m = r.abs()
    if style == "interleaved":
        pr = r[..., :R].unflatten(-1, (-1, 2))
        m[..., :R] = pr.pow(2).sum(-1, keepdim=True).sqrt().expand_as(pr).flatten(-2)
    else:
        a, b = r[..., : R // 2], r[..., R // 2 : R]
        n = (a * a + b * b).sqrt()
        m[..., :R] = torch.cat((n, n), -1)
    return m


def _head_pair_magnitude(ref: torch.Tensor, shape) -> torch.Tensor:
    """``_pair_magnitude`` of a QK output whose last axis is D or H*D (Wan's flat rows)."""
    heads = ref.reshape(*ref.shape[:-1], -1, shape.D)
    return _pair_magnitude(heads, shape.style, shape.rotary_dim or shape.D).reshape(ref.shape)


def _err(out: torch.Tensor, ref: torch.Tensor, loose: float = 1.0, scale=None) -> float:
    """Largest |out - ref| / (rtol |ref| + atol); <= 1 passes.

    ``loose`` > 1 also scales the absolute term by the data's mean magnitude: for chains
    that round between steps whose terms cancel (DyT's gamma * t + beta). ``scale`` (a
    tensor like ref) replaces |ref| in the relative term: for RoPE outputs the magnitude of
    the element's rotary pair (``_pair_magnitude``) -- the rotation mixes the two rounded
    normalised values, so one flipped rounding of either moves the output by up to an ulp
    of the pair's magnitude, however much the element itself cancels.
    """
    rtol, atol = TOL[out.dtype]
    o, r = out.double(), ref.double()
    mag = r.abs() if scale is None else scale
    # A tie flipped at the intermediate rounding moves the result by up to an ulp of the
    # normalised input, not of the (possibly cancelled, tiny) result: scale the absolute
    # term by the data's RMS.
    atol = max(atol, rtol * r.pow(2).mean().sqrt().item())
    if loose != 1.0:
        atol = max(atol, rtol * r.abs().mean().item())
    return ((o - r).abs() / (loose * (rtol * mag + atol))).max().item()


DIFFUSERS_MISSING = "diffusers is not installed: pip install 'ditfuse[diffusers]'"


class Gates:
    """The rows of the table, each printed as it is added with ``[n/total]`` progress.

    ``total`` is the number of rows the run plans (:func:`planned_gates`); a row past it
    raises the count shown rather than print ``[n/total]`` with n > total. A skipped gate
    (``skip``) is neither passed nor failed: the summary counts it apart.
    """

    def __init__(self, total: int = 0, echo: bool = True):
        self.rows = []
        self.total = total
        self.echo = echo
        self.skip_reasons = []

    def _row(self, gate, case, result, detail):
        self.rows.append((gate, case, result, detail))
        if self.echo:
            n = len(self.rows)
            total = max(self.total, n)
            w = len(str(total))
            print(f"[{n:>{w}}/{total}] {result}  {gate:24s} {case:28s} {detail}", flush=True)

    def add(self, gate, case, ok, detail):
        self._row(gate, case, "PASS" if ok else "FAIL", detail)

    def skip(self, gate, case, reason):
        if reason not in self.skip_reasons:
            self.skip_reasons.append(reason)
        self._row(gate, case, "SKIP", f"skipped: {reason}")

    def table(self) -> str:
        w = [
            max(len(str(r[i])) for r in self.rows + [("gate", "case", "result", "detail")])
            for i in range(4)
        ]
        lines = [
            " | ".join(h.ljust(w[i]) for i, h in enumerate(("gate", "case", "result", "detail")))
        ]
        lines.append("-+-".join("-" * x for x in w))
        lines += [" | ".join(str(c).ljust(w[i]) for i, c in enumerate(r)) for r in self.rows]
        return "\n".join(lines)

    def counts(self):
        """(passed, failed, skipped)."""
        res = [r[2] for r in self.rows]
        return res.count("PASS"), res.count("FAIL"), res.count("SKIP")

    def summary(self) -> str:
        """The counts line, e.g. ``100/100 gates passed, 2 skipped (why)``: a skipped gate
        is counted apart, not as passed."""
        passed, failed, skipped = self.counts()
        s = f"{passed}/{passed + failed} gates passed"
        if failed:
            s += f", {failed} FAILED"
        if skipped:
            s += f", {skipped} skipped ({'; '.join(self.skip_reasons)})"
        return s

    @property
    def ok(self) -> bool:
        """No gate failed (skipped gates do not fail the run)."""
        return all(r[2] != "FAIL" for r in self.rows)


@torch.no_grad()
def qk_accuracy(g: Gates, device, small: bool, dtypes):
    for shape in QK_SHAPES.values():
        if small:
            shape = shape.small()
        for dtype in dtypes:
            inp = qk_inputs(shape, device, dtype)
            kw = dict(inp["kwargs"], q_norm=inp["q_norm"], k_norm=inp["k_norm"])
            rq, rk = qk_norm_rope_reference(
                inp["q"], inp["k"], inp["cos"], inp["sin"], compute_dtype=torch.float64, **kw
            )
            eq, ek = eager_fn(shape)(inp)
            oq, ok_ = qk_norm_rope(
                inp["q"], inp["k"], inp["call_cos"], inp["call_sin"], inplace=shape.inplace, **kw
            )
            if oq.dim() != rq.dim():
                rq, rk = rq.reshape(oq.shape), rk.reshape(ok_.shape)
            eq, ek = eq.reshape(oq.shape), ek.reshape(ok_.shape)
            # the eager DyT chain rounds after each of its four steps in half precision
            loose = 4.0 if shape.norm == "dyt" and dtype != torch.float32 else 1.0
            mq, mk = (_head_pair_magnitude(t, shape) for t in (rq, rk))
            e = max(_err(oq, rq, scale=mq), _err(ok_, rk, scale=mk))
            e_e = max(_err(oq, eq, loose, scale=mq), _err(ok_, ek, loose, scale=mk))
            share = min((oq == rq).float().mean().item(), (ok_ == rk).float().mean().item())
            share_e = min((oq == eq).float().mean().item(), (ok_ == ek).float().mean().item())
            ok = e <= 1 and e_e <= 1 and (share >= 0.97 or dtype == torch.float32)
            name = str(dtype).replace("torch.", "")
            g.add(
                "qk accuracy",
                f"{shape.name} {name}",
                ok,
                f"S={shape.S}; vs fp64 ref: err/tol {e:.2f}, {100 * share:.2f}% bitwise; "
                f"vs eager model code: err/tol {e_e:.2f}, {100 * share_e:.2f}% bitwise",
            )
            del inp, rq, rk, eq, ek, oq, ok_


_LAYOUT_STYLES = ("interleaved", "half")
_LAYOUT_HEADS = ((24, 64), (24, 128), (40, 128))


@torch.no_grad()
def qk_layout_bitwise(g: Gates, device, small: bool):
    S = 3 if small else 4096
    for style in _LAYOUT_STYLES:
        for H, D in _LAYOUT_HEADS:
            gen = torch.Generator(device=device).manual_seed(H + D)
            buf = torch.randn(1, S, 3 * H * D, generator=gen, device=device).to(torch.bfloat16)
            w = (torch.randn(H * D, generator=gen, device=device) + 1).to(torch.bfloat16)
            norm = NormSpec("rms", weight=w, eps=1e-6)
            cos, sin = rope_table(S, D, style, device)
            expanded = (
                cos[:, None].expand(S, H, D).contiguous(),
                sin[:, None].expand(S, H, D).contiguous(),
            )
            outs, v_ok = [], True
            for c, s in ((cos, sin), expanded):
                b = buf.clone()
                qk_norm_rope(
                    b[..., : H * D],
                    b[..., H * D : 2 * H * D],
                    c,
                    s,
                    q_norm=norm,
                    k_norm=norm,
                    num_heads=H,
                    rope_style=style,
                    inplace=True,
                )
                v_ok &= torch.equal(b[..., 2 * H * D :], buf[..., 2 * H * D :])
                outs.append(b)
            same = torch.equal(outs[0], outs[1])
            g.add(
                "qk shared==expanded",
                f"{style} {H}x{D}",
                same and v_ok,
                f"S={S} rtol=0 atol=0: {'identical' if same else 'DIFFERENT'}; "
                f"V slice {'unchanged' if v_ok else 'CHANGED'}",
            )


@torch.no_grad()
def qk_int64_offsets(g: Gates, device):
    """A packed QKV of more than 2^31 elements, checked at its last tokens."""
    H, D = 40, 128
    S = (2**31) // (3 * H * D) + 64
    buf = torch.empty(1, S, 3 * H * D, device=device, dtype=torch.bfloat16)
    buf.normal_()
    q, k = buf[..., : H * D], buf[..., H * D : 2 * H * D]
    w = torch.randn(H * D, device=device).to(torch.bfloat16) + 1
    norm = NormSpec("rms", weight=w, eps=1e-6)
    cos, sin = rope_table(S, D, "interleaved", device)
    tail = slice(S - 8, S)
    rq, rk = qk_norm_rope_reference(
        q[:, tail],
        k[:, tail],
        cos[tail],
        sin[tail],
        q_norm=norm,
        k_norm=norm,
        num_heads=H,
        compute_dtype=torch.float64,
    )
    v_before = buf[:, tail, 2 * H * D :].clone()
    qk_norm_rope(q, k, cos, sin, q_norm=norm, k_norm=norm, num_heads=H, inplace=True)
    e = max(_err(q[:, tail], rq), _err(k[:, tail], rk))
    v_ok = torch.equal(buf[:, tail, 2 * H * D :], v_before)
    g.add(
        "qk int64 offsets",
        f"packed {buf.numel() / 2**31:.2f}x2^31 el",
        e <= 1 and v_ok,
        f"last 8 tokens err/tol {e:.2f}; V {'unchanged' if v_ok else 'CHANGED'}",
    )
    del buf


@torch.no_grad()
def adaln_accuracy(g: Gates, device, small: bool, dtypes):
    """AdaLN modulate, gated residual + modulate and the gated residual alone vs fp64 and vs
    the models' eager code."""
    import torch.nn.functional as F

    from ditfuse.ops.adaln import adaln_modulate, gated_residual, gated_residual_adaln
    from ditfuse.reference import adaln_reference
    from ditfuse.tools.shapes import ADALN_SHAPES

    for shape in ADALN_SHAPES.values():
        if small:
            shape = shape.small()
        B, S, D = shape.B, shape.S, shape.D
        for dtype in dtypes:
            gen = torch.Generator(device=device).manual_seed(D + S)
            x = torch.randn(B, S, D, generator=gen, device=device).to(dtype)
            y = torch.randn(B, S, D, generator=gen, device=device).to(dtype)
            flux = shape.model == "flux"
            if flux:  # emb.chunk(6, dim=1) in the activation dtype
                temb = (torch.randn(B, 6 * D, generator=gen, device=device) * 0.3).to(dtype)
                sh, sc, gt = [t for t in temb.chunk(6, 1)[:3]]
                rounding = "per_op"
            elif shape.per_token:  # (B, S, 6, D) fp32
                temb = torch.randn(B, S, 6, D, generator=gen, device=device) * 0.3
                sh, sc, gt = [t.squeeze(2) for t in temb.chunk(6, 2)[:3]]
                rounding = "once"
            else:  # (table + temb.float()).chunk(6, dim=1)
                temb = torch.randn(B, 6, D, generator=gen, device=device) * 0.3
                sh, sc, gt = temb.chunk(6, 1)[:3]
                rounding = "once"
            if flux:
                s3, c3, g3 = sh[:, None], sc[:, None], gt[:, None]
                eager_m = F.layer_norm(x, (D,), eps=1e-6) * (1 + c3) + s3
                eager_x = x + g3 * y
                eager_m2 = F.layer_norm(eager_x, (D,), eps=1e-6) * (1 + c3) + s3
            else:
                eager_m = (F.layer_norm(x.float(), (D,), eps=1e-6) * (1 + sc) + sh).type_as(x)
                eager_x = (x.float() + y * gt).type_as(x)
                eager_m2 = (F.layer_norm(eager_x.float(), (D,), eps=1e-6) * (1 + sc) + sh).type_as(
                    x
                )
            m = adaln_modulate(x, sh, sc, eps=1e-6, rounding=rounding)
            xn, m2 = gated_residual_adaln(x, y, gt, sh, sc, eps=1e-6, rounding=rounding)
            rm = adaln_reference(
                x, sh, sc, eps=1e-6, rounding=rounding, compute_dtype=torch.float64
            )
            rxn, rm2 = adaln_reference(
                x,
                sh,
                sc,
                eps=1e-6,
                rounding=rounding,
                residual=y,
                gate=gt,
                compute_dtype=torch.float64,
            )
            e = max(_err(m, rm), _err(m2, rm2), _err(xn, rxn))
            e_e = max(_err(m, eager_m), _err(m2, eager_m2), _err(xn, eager_x))
            share = min((m == rm).float().mean().item(), (m2 == rm2).float().mean().item())
            share_e = min(
                (m == eager_m).float().mean().item(), (m2 == eager_m2).float().mean().item()
            )
            x_bitwise = torch.equal(xn, eager_x) and torch.equal(
                gated_residual(x, y, gt, rounding=rounding), eager_x
            )
            ok = e <= 1 and e_e <= 1 and x_bitwise and (share >= 0.97 or dtype == torch.float32)
            name = str(dtype).replace("torch.", "")
            g.add(
                "adaln accuracy",
                f"{shape.name} {name}",
                ok,
                f"S={S} {rounding}; vs fp64: err/tol {e:.2f}, {100 * share:.2f}% bitwise; "
                f"vs eager: "
                f"err/tol {e_e:.2f}, {100 * share_e:.2f}% bitwise; residual (both ops) "
                f"{'bitwise' if x_bitwise else 'DIFFERS'}",
            )
            del x, y, m, m2, xn, rm, rm2, rxn, eager_m, eager_m2, eager_x


@torch.no_grad()
def activation_accuracy(g: Gates, device, small: bool, dtypes):
    """SwiGLU / GELU (tanh) at the FLUX shapes, x read in place as the model's column slice:
    vs fp64 (the contract's bound: ``reference.swiglu_bound`` / ``gelu_bound``) and vs the
    models' eager code (SwiGLU on the GPU: the same arithmetic, bitwise); written into a
    column slice of a wider buffer, bitwise the plain result, other columns untouched."""
    import torch.nn.functional as F

    from ditfuse.ops.activations import gelu, swiglu
    from ditfuse.reference import gelu_bound, swiglu_bound
    from ditfuse.tools.shapes import ACT_SHAPES

    gpu = device != "cpu"
    for shape in ACT_SHAPES.values():
        if small:
            shape = shape.small()
        B, S, N = shape.B, shape.S, shape.N
        sw = shape.op == "swiglu"
        for dtype in dtypes:
            gen = torch.Generator(device=device).manual_seed(N + S)
            proj = (torch.randn(B, S, shape.offset + shape.W, generator=gen, device=device) * 2).to(
                dtype
            )
            x = proj[..., shape.offset :]
            if sw:
                y, eager = swiglu(x), F.silu(x[..., :N]) * x[..., N:]
                exact, tol = swiglu_bound(x)
                tol_e = tol
            else:
                y, eager = gelu(x, "tanh"), F.gelu(x, approximate="tanh")
                exact, tol = gelu_bound(x)
                # torch's vectorised CPU tanh / erf are less accurate than CUDA's in the tail
                tol_e = gelu_bound(x, loose=1.0 if gpu else 2.0)[1]
            e = ((y.double() - exact).abs() / tol).max().item()
            e_e = ((eager.double() - exact).abs() / tol_e).max().item()
            share_e = (y == eager).float().mean().item()
            buf = torch.randn(B, S, N + 8, generator=gen, device=device).to(dtype)
            keep = buf[..., :8].clone()
            if sw:
                swiglu(x, out=buf[..., 8:])
            else:
                gelu(x, "tanh", out=buf[..., 8:])
            into = torch.equal(buf[..., 8:], y) and torch.equal(buf[..., :8], keep)
            if sw:  # the eager ops' arithmetic: bitwise on the GPU; interpreter: exp's last bit
                want = 1.0 if gpu else (0.999 if dtype != torch.float32 else 0.9)
            else:  # bitwise not promised: reported; high in half precision
                want = 0.98 if dtype != torch.float32 else 0.0
            ok = e <= 1 and e_e <= 1 and into and share_e >= want
            g.add(
                "activation accuracy",
                f"{shape.op} {shape.name} {str(dtype)[6:]}",
                ok,
                f"S={S}; vs fp64: err/bound {e:.2f} (eager {e_e:.2f}); vs eager: "
                f"{100 * share_e:.2f}% bitwise (gate {100 * want:.1f}%); into a buffer "
                f"slice {'bitwise' if into else 'DIFFERS'}",
            )
            del proj, x, y, eager, exact, tol, tol_e, buf


def _have_diffusers(g: Gates, gate: str) -> bool:
    try:
        import diffusers  # noqa: F401
    except ImportError:
        g.skip(gate, "diffusers", DIFFUSERS_MISSING)
        return False
    return True


def _patch_round_trip(model, run):
    """(replacements, unpatched outputs, patched outputs, whether unpatch restores them
    bit for bit) of ``run()``, a tuple of tensors computed by ``model``."""
    from ditfuse.patching import patch, unpatch

    ref = run()
    report = patch(model)
    out = run()
    unpatch(model)
    restored = all(torch.equal(a, b) for a, b in zip(run(), ref))
    return sum(report.counts.values()), ref, out, restored


@torch.no_grad()
def patch_gates(g: Gates, device):
    """Every model ditfuse.patch covers (tiny configs, random weights): patched vs
    unpatched outputs in bf16 (bitwise expected) and fp32, and unpatch restoring them."""
    if not _have_diffusers(g, "patch (tiny model)"):
        return
    from ditfuse.tools.tiny_models import CASES, close, to_dtype

    for name, make, inputs, expected in CASES:
        for dtype in (torch.bfloat16, torch.float32):
            model = to_dtype(make(), dtype).to(device)
            kw = {
                k: (v.to(device) if isinstance(v, torch.Tensor) else v)
                for k, v in inputs(dtype).items()
            }
            n, (ref,), (out,), restored = _patch_round_trip(model, lambda: (model(**kw)[0],))
            err, scale, share = close(out, ref, dtype)
            ok = (
                restored
                and n == sum(expected.values())
                and (
                    share == 1.0 if dtype == torch.bfloat16 else err <= PATCHED_MODEL[dtype] * scale
                )
            )
            g.add(
                "patch (tiny model)",
                f"{name} {str(dtype)[6:]}",
                ok,
                f"{n} replacements; patched vs unpatched: {100 * share:.1f}% bitwise, max diff "
                f"{err:.2g} of {scale:.2g}; unpatch "
                f"{'restores' if restored else 'DOES NOT restore'}",
            )


def patch_fp8_gates(g: Gates, device, small: bool):
    """``patch(attention="fp8")`` on each family's tiny model (:mod:`check_patch_fp8`)."""
    if _have_diffusers(g, check_patch_fp8.GATE):
        check_patch_fp8.check_gates(g, device, small)


@torch.no_grad()
def vae_patch_gates(g: Gates, device):
    """The VAEs ``patch`` covers (tiny configs, random weights): the decode and encode patched
    vs unpatched (every norm -> SiLU pair on the kernels: fp32 within 1e-5 of the output's
    scale with TF32 off, 16-bit within 5% -- a pair's one-rounding differences through the
    layers after it), the pairs counted, and unpatch restoring the outputs bit for bit."""
    if not _have_diffusers(g, "patch (tiny VAE)"):
        return
    from ditfuse.tools.tiny_models import VAE_CASES, _randomize, close, to_dtype, vae_inputs

    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        for name, make, zshape, xshape, pairs in VAE_CASES:
            for dtype in (torch.bfloat16, torch.float32):
                vae = to_dtype(_randomize(make()), dtype).to(device).eval()
                z, x = (t.to(device) for t in vae_inputs(zshape, xshape, dtype))

                n, ref, out, restored = _patch_round_trip(
                    vae, lambda: (vae.decode(z).sample, vae.encode(x).latent_dist.mean)
                )
                stats = [close(o, r, dtype) for o, r in zip(out, ref)]
                bound = PATCHED_VAE[dtype]
                ok = restored and n == pairs and all(e <= bound * sc for e, sc, _ in stats)
                g.add(
                    "patch (tiny VAE)",
                    f"{name} {str(dtype)[6:]}",
                    ok,
                    f"{n} norm + SiLU pairs; decode / encode patched vs unpatched: max diff "
                    + " / ".join(
                        f"{e:.2g} of {sc:.2g} ({100 * sh:.0f}% bitwise)" for e, sc, sh in stats
                    )
                    + f"; unpatch {'restores' if restored else 'DOES NOT restore'}",
                )
    finally:
        torch.backends.cudnn.allow_tf32 = tf32


def _dtypes(small: bool):
    return (
        [torch.bfloat16, torch.float16, torch.float32] if small else [torch.bfloat16, torch.float32]
    )


def _group_norm_count(small: bool) -> int:
    """The rows ``check_group_norm.check_gates`` adds with its default shapes and dtypes:
    the VAE shapes (small: those not channels-last, plus two forced split-path runs of the
    first GroupNorm shape; GPU: eight of them and one shape whose groups fit a program)."""
    from ditfuse.tools.shapes import GN_SHAPES

    if small:
        shapes = [s for s in GN_SHAPES.values() if not s.channels_last]
        runs = len(shapes) + 2 * any(s.op == "gn" for s in shapes)
    else:
        runs = 8 + 1
    return runs * len(_dtypes(small))


def planned_gates(small: bool, int64: bool) -> int:
    """How many rows ``main`` adds: the denominator of the progress lines."""
    from importlib.util import find_spec

    from ditfuse.tools.shapes import ACT_SHAPES, ADALN_SHAPES
    from ditfuse.tools.tiny_models import CASES, VAE_CASES

    nd = len(_dtypes(small))
    n = len(QK_SHAPES) * nd + len(_LAYOUT_STYLES) * len(_LAYOUT_HEADS)
    n += len(ADALN_SHAPES) * nd + len(ACT_SHAPES) * nd
    n += _group_norm_count(small) + 4  # swa: fp32 / bf16, plain / differential
    n += check_attention_fp8.planned(small)
    have = find_spec("diffusers") is not None
    n += 2 * len(CASES) if have else 1  # bf16 and fp32 each, or one SKIP row
    n += 2 * len(VAE_CASES) if have else 1
    n += check_patch_fp8.planned(small, have)
    n += check_linear_fp8.planned(small)
    return n + int(int64)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="ditfuse check",
        description=__doc__,
        epilog="Each gate prints a line as it finishes ([n/total] PASS|FAIL|SKIP ...); the "
        "table and the summary follow. Exit status 1 when a gate failed (skipped "
        "gates, e.g. without diffusers, do not fail the run).",
    )
    ap.add_argument("--small", action="store_true", help="few tokens per shape even on a GPU")
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args(argv)
    gpu = torch.cuda.is_available() and not backend.INTERPRET
    device = "cuda" if gpu else "cpu"
    small = args.small or not gpu
    int64 = gpu and not args.small
    g = Gates(planned_gates(small, int64))
    print(
        f"ditfuse check on {backend.describe_backend()}; "
        f"{'interpreter-sized shapes' if small else 'production shapes'}; {g.total} gates",
        flush=True,
    )
    t0 = time.time()
    dtypes = _dtypes(small)
    qk_accuracy(g, device, small, dtypes)
    qk_layout_bitwise(g, device, small)
    adaln_accuracy(g, device, small, dtypes)
    activation_accuracy(g, device, small, dtypes)
    group_norm_gates(g, device, small)
    attention_gates(g, device, small)
    check_attention_fp8.check_gates(g, device, small)
    check_attention_fp8.check_8bit_qk_gates(g, device, small)
    check_attention_fp8.check_out_rows8_gates(g, device, small)
    patch_gates(g, device)
    vae_patch_gates(g, device)
    patch_fp8_gates(g, device, small)
    check_linear_fp8.check_gates(g, device, small)
    if int64:
        qk_int64_offsets(g, device)
    table = g.table()
    summary = f"{g.summary()} in {time.time() - t0:.0f} s on {backend.describe_backend()}"
    print("\n" + table + "\n\n" + summary, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n\n" + summary + "\n")
    return 0 if g.ok else 1


if __name__ == "__main__":
    sys.exit(main())
