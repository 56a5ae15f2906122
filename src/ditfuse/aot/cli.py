"""``ditfuse export OP [options] -o DIR``: write an AOT package (no GPU needed).

    ditfuse export qk_norm_rope -o wan_qk                 # Wan 14B defaults, sm_90
    ditfuse export qk_norm_rope --heads 12 -o wan13b_qk --target sm_80
    ditfuse export adaln_modulate --dim 5120 -o wan_mod --c-header
    ditfuse export --list

Exit status: 0 written, 3 refused by a packaging rule (the message says which and why),
2 bad usage, 1 anything else.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from ditfuse.aot.ops import REGISTRY


def _parser() -> argparse.ArgumentParser:
    from ditfuse.aot.export import TARGETS

    p = argparse.ArgumentParser(
        prog="ditfuse export",
        description="Compile one specialization of a ditfuse op to PTX + cubin + manifest "
        "(an AOT package for TensorRT, C++ or cuda-python), without a GPU.",
    )
    p.add_argument("--list", action="store_true", help="list the exportable ops and exit")
    sub = p.add_subparsers(dest="op", metavar="OP")
    for e in REGISTRY.values():
        s = sub.add_parser(e.op, help=e.summary, description=e.summary)
        s.add_argument("-o", "--out", required=True, metavar="DIR", help="package directory")
        s.add_argument(
            "--target",
            default=e.default_target,
            choices=TARGETS,
            help=f"GPU architecture (default {e.default_target}; Triton's sm_90a PTX "
            "is retargeted to sm_90 when it uses no sm_90a-only instruction)",
        )
        s.add_argument(
            "--num-stages",
            type=int,
            default=None,
            help="software-pipelining depth (default: the JIT call's"
            + (
                f"; {e.stages_note or e.default_num_stages} for this op"
                if e.default_num_stages
                else ""
            )
            + "): fewer stages, less shared memory, same arithmetic",
        )
        s.add_argument(
            "--allow-large-smem",
            action="store_true",
            help="package a kernel needing more than 48 KB of shared memory",
        )
        s.add_argument(
            "--c-header",
            action="store_true",
            help="also write kernel.h / kernel.c (cubin embedded, typed launch "
            "function over the CUDA driver API)",
        )
        s.add_argument("--json", action="store_true", help="print the manifest")
        for o in e.options:
            kw = dict(
                type=o.type,
                default=None,
                metavar=o.name.upper(),
                help=f"{o.help} (default {o.default})",
            )
            if o.choices is not None:
                kw["choices"] = list(o.choices)
            s.add_argument(o.flag, dest=o.name, **kw)
    return p


def summary(m) -> str:
    def shape(p):
        return "(" + ", ".join(str(d) for d in p["shape"]) + ")"

    rows = []
    for p in m["parameters"]:
        if p["kind"] == "extra":
            rows.append(f"{p['name']}: extra int32 = {m['symbols'].get(p['name'], p['value'])}")
        else:
            al = f", aliases {p['aliases']}" if p.get("aliases") else ""
            rows.append(f"{p['name']}: {p['kind']} {p['dtype']} {shape(p)}{al}")
    lines = [
        f"ditfuse export: {m['op']} -> {m['target']} ({m['summary']})",
        f"  entry      {m['entry']}",
        "  params     " + "\n             ".join(rows),
        f"  launch     grid ({', '.join(m['grid'])}), block ({', '.join(map(str, m['block']))}),"
        f" {m['shared_mem']} B dynamic shared memory",
        f"  resources  {m['registers']} registers, "
        f"spills {m['spill_stores']}/{m['spill_loads']} B, "
        f"stack {m['stack']} B, LDL/STL {m['local_memory_instructions']['LDL']}/"
        f"{m['local_memory_instructions']['STL']} (ptxas -v --gpu-name={m['target']}; "
        f"the JIT build: {m['jit_reference']['registers']} registers)",
    ]
    lines += [f"  rewrite    {r}" for r in m["rewrites"]]
    j = m["jit_reference"]
    lines.append(
        "  arithmetic "
        + (
            "the same floating-point instructions as the JIT build"
            if j["float_ops_equal"]
            else f"differs from the JIT build {j['float_ops_diff']} (package, "
            f"JIT): {j['float_ops_note']}"
        )
    )
    lines.append(f"  files      {', '.join(m['files'].values())}, manifest.json")
    lines.append(f"  sha256     ptx {m['sha256']['ptx']}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = _parser()
    args = p.parse_args(argv)
    if args.list or not args.op:
        for e in REGISTRY.values():
            print(f"{e.op:26} {e.summary}")
        return 0 if args.list else 2
    from ditfuse.aot.compile import can_compile_here
    from ditfuse.aot.export import CHILD_ENV, PackageOptions, export_here, run_subprocess
    from ditfuse.aot.ptx import AotRefusal

    if not can_compile_here():
        if os.environ.get(CHILD_ENV):
            print(
                "ditfuse export: the kernels are interpreted although TRITON_INTERPRET=0 was "
                "asked for",
                file=sys.stderr,
            )
            return 1
        return run_subprocess(argv, capture=False).returncode
    e = REGISTRY[args.op]
    opts = e.resolve(**{o.name: getattr(args, o.name) for o in e.options})
    try:
        m = export_here(e, opts, args.out, PackageOptions.from_args(args))
    except AotRefusal as err:
        print(f"ditfuse export: refused {err}", file=sys.stderr)
        return 3
    if args.json:
        import json

        print(json.dumps(m, indent=1))
    else:
        print(summary(m))
        print(
            f"  written    {args.out}/ (how to launch it: {args.out}/README.txt; the loader "
            f"{args.out}/{m['files']['loader']} needs no Triton)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
