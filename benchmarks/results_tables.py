"""Markdown tables of a `ditfuse bench` CSV, one per op.

    python benchmarks/results_tables.py benchmarks/results/NVIDIA-H200-2026-12-04.csv [OP ...]

Columns: floor us (bytes model / the run's copy ceiling), the median us of every impl the
CSV has for the op -- "copy" is a contiguous copy of the op's main tensors (Q and K, x, or
x and y), what moving them takes at this size (at tens of MB it stays well under the 2 GiB
copy's rate) --, % of the
ceiling and the speed-up over torch.compile (over FlexAttention for attention), both from
the CUDA-graph time. The 8-bit attention rows (op ``attention_fp8``, compute-bound) get a table
of their own: time, TFLOP/s, speed-ups over the fastest SDPA backend and SageAttention,
accuracy against float64 per input family, and the note (a refused backend, a missing
package)."""

import csv
import sys
from collections import defaultdict

from ditfuse.tools.bench import ACCURACY_COLUMNS, LEGACY_ACCURACY_COLUMNS

ORDER = ["copy", "eager", "compile", "liger", "flex", "ditfuse", "ditfuse-graph"]
NAMES = {"compile": "torch.compile", "ditfuse": "ditfuse call", "ditfuse-graph": "ditfuse graph"}


def attention_fp8_table(rows):
    """Markdown table of the ``attention_fp8`` rows: a cos / rel L2 column pair per input
    family the CSV has values for (older CSVs: randn and rmsnorm)."""

    def cell(r, c, fmt):
        v = r.get(c) or ""
        try:
            return format(float(v), fmt) if v.lower() != "nan" else "-"
        except ValueError:
            return v

    fams = list(
        dict.fromkeys(
            c[4:]
            for c in ACCURACY_COLUMNS + LEGACY_ACCURACY_COLUMNS
            if c.startswith("cos_") and any(r.get(c) for r in rows)
        )
    )
    head = "".join(f" cos {f} | rel L2 {f} |" for f in fams)
    out = [
        "`attention_fp8`",
        "",
        f"| shape | dtype | impl | us | TFLOP/s | x best SDPA | x Sage |{head} note |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |" + " ---: | ---: |" * len(fams) + " --- |",
    ]
    for r in rows:
        acc = "".join(
            f" {cell(r, f'cos_{f}', '.6f')} | {cell(r, f'rel_l2_{f}', '.2e')} |" for f in fams
        )
        out.append(
            f"| {r['shape']} | {r['dtype']} | {r['impl']} | {cell(r, 'us', '.1f')} | "
            f"{cell(r, 'tflops', '.1f')} | {cell(r, 'x_best_sdpa', '.3f')} | "
            f"{cell(r, 'x_sage', '.3f')} |{acc} {(r.get('note') or '').replace('|', '/')} |"
        )
    return out + [""]


def tables(path, ops=None):
    cases = defaultdict(dict)
    fp8 = []
    for r in csv.DictReader(open(path)):
        if r["op"] == "attention_fp8":
            fp8.append(r)
            continue
        cases[(r["op"], r["shape"], r["dtype"])][r["impl"]] = (float(r["us"]), float(r["pct_copy"]))
    out = attention_fp8_table(fp8) if fp8 and (not ops or "attention_fp8" in ops) else []
    for op in dict.fromkeys(k[0] for k in cases):
        if ops and op not in ops:
            continue
        keys = [k for k in cases if k[0] == op]
        impls = [i for i in ORDER if any(i in cases[k] for k in keys)]
        vs = "flex" if "flex" in impls else "compile"
        out += [
            f"`{op}`",
            "",
            "| shape | dtype | floor us | "
            + " | ".join(NAMES.get(i, i) for i in impls)
            + f" | % ceiling | x {'flex' if vs == 'flex' else 'compile'} |",
            "| --- | --- | ---: | " + " | ".join("---:" for _ in impls) + " | ---: | ---: |",
        ]
        for k in keys:
            c = cases[k]
            g = c.get("ditfuse-graph")
            floor = g[0] * g[1] / 100 if g else float("nan")
            cells = [f"{c[i][0]:.1f}" if i in c else "-" for i in impls]
            speed = f"{c[vs][0] / g[0]:.2f}" if g and vs in c else "-"
            out.append(
                f"| {k[1]} | {k[2]} | {floor:.1f} | "
                + " | ".join(cells)
                + f" | {g[1]:.1f} | {speed} |"
                if g
                else ""
            )
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(tables(sys.argv[1], sys.argv[2:] or None))
