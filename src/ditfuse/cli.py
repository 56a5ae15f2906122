"""The ``ditfuse`` command: check (parity gates), bench (speed), inspect (resources)."""
from __future__ import annotations

import sys

USAGE = """usage: ditfuse {check,bench,inspect} [options]

  check     parity gates of every op (GPU: production shapes; else the interpreter)
  bench     time every op at the registry's production shapes (GPU only)
  inspect   registers, spills, local memory of every shipped kernel (no GPU needed)
"""


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "check":
        from .check import main as run
    elif cmd == "bench":
        from .bench import main as run
    elif cmd == "inspect":
        from .inspect_kernels import main as run
    else:
        print(f"ditfuse: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
