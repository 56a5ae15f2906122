"""GroupNorm / channel-RMS parity gates of ``ditfuse check`` on CUDA, one PASS / FAIL line
each (the device scripts count them): ``python3 benchmarks/gn_gates.py``."""
from ditfuse import group_norm as gn


class Lines:
    def add(self, gate, case, ok, detail):
        print("PASS" if ok else "FAIL", gate, case, detail, flush=True)


gn.check_gates(Lines(), "cuda", False)
