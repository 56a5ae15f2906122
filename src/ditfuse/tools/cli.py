"""The ``ditfuse`` command: check (parity), bench (speed), inspect (resources), export (AOT)."""

from __future__ import annotations

import sys

USAGE = """usage: ditfuse {check,bench,inspect,export} [options]
       ditfuse --version | --help

  check     parity gates of every op (GPU: production shapes; else the interpreter); the
            model-patching gates need diffusers: pip install 'ditfuse[diffusers]'
  bench     time every op at the registry's production shapes (GPU only)
  inspect   registers, spills, local memory of every shipped kernel (no GPU needed)
  export    AOT package of one op: PTX + cubin + manifest for TensorRT / C (no GPU needed):
            ditfuse export qk_norm_rope -o DIR [--target sm_90] (ditfuse export --list)

  ditfuse COMMAND --help   the options of one command
"""


def version_text() -> str:
    """ditfuse's version, the torch / triton it runs with and where its kernels run."""
    from ditfuse._version import __version__

    lines = [f"ditfuse {__version__}"]
    try:
        import torch

        lines.append(f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'})")
    except ImportError:
        lines.append("torch: not installed")
    try:
        import triton

        lines.append(f"triton {triton.__version__}")
    except ImportError:
        lines.append("triton: not installed")
    try:
        from ditfuse.runtime.backend import describe_backend

        lines.append(f"backend {describe_backend()}")
    except ImportError as e:
        lines.append(f"backend: unavailable ({e})")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        print(version_text())
        return 0
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
