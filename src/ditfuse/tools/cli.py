"""The ``ditfuse`` command: check (parity), bench (speed), inspect (resources), export (AOT)."""
from __future__ import annotations

import sys

USAGE = """usage: ditfuse {check,bench,inspect,export} [options]

  check     parity gates of every op (GPU: production shapes; else the interpreter)
  bench     time every op at the registry's production shapes (GPU only)
  inspect   registers, spills, local memory of every shipped kernel (no GPU needed)
  export    AOT package of one op: PTX + cubin + manifest for TensorRT / C (no GPU needed):
            ditfuse export qk_norm_rope -o DIR [--target sm_90] (ditfuse export --list)
"""


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "check":
        from ditfuse.tools.check import main as run
    elif cmd == "bench":
        from ditfuse.tools.bench import main as run
    elif cmd == "inspect":
        from ditfuse.tools.inspect import main as run
    elif cmd == "export":
        from ditfuse.aot.cli import main as run
    else:
        print(f"ditfuse: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
