"""sm_90 builds of the attention kernel at SAME-L's specializations under launch settings
other than the table's (no GPU): registers, spills, shared memory, SASS instructions.

    TRITON_INTERPRET=0 PYTHONPATH=src python benchmarks/attn_variants_build.py \
        "64,128,4,1" "64,128,4,1,,168" "64,32,4,3,,168,62" "64,16,4,3,1,,62,1" "32,16,2,3,1,,30,,1" [--specs same-l-bf16-attn,same-l-trt-fp32]
"""
import sys

from ditfuse import attention as A


def parse(s):
    f = s.split(",")
    out = [int(x) for x in f[:4]]
    if len(f) > 4:
        out.append(None if f[4] == "" else bool(int(f[4])))
    if len(f) > 5:
        out.append(int(f[5]) if f[5] else None)
    if len(f) > 6:
        out.append(int(f[6]) if f[6] else None)
    if len(f) > 7:
        out.append(bool(int(f[7]) if f[7] else False))
    if len(f) > 8:
        out.append(bool(int(f[8])))
    return A.Settings(*out)


def main(argv):
    specs = ["same-l-bf16-attn", "same-l-fp32-attn", "same-l-trt-fp32"]
    rest = []
    for a in argv:
        if a.startswith("--specs="):
            specs = a.split("=", 1)[1].split(",")
        else:
            rest.append(a)
    table = A.launch_settings
    for st in [None] + [parse(a) for a in rest]:
        if st is not None:
            A.launch_settings = lambda *a, st=st, **k: st
        try:
            for name in specs:
                spec = next(s for s in A.BUILD_SPECS if s.name == name)
                row = A.build(spec)
                print(f"{name:18s} {str(tuple(st) if st else 'table'):32s} regs {row['regs']:3d} "
                      f"spill {row['spill_stores']}/{row['spill_loads']} smem {row['smem']:6d} "
                      f"wgmma {row['wgmma']} mma {row['mma']} sass {row['sass_instructions']} {row['violations']}", flush=True)
        finally:
            A.launch_settings = table


if __name__ == "__main__":
    main(sys.argv[1:])
