"""Merge benchmark CSVs of one GPU and day: rows of later files replace the earlier rows of
the same (op, shape, dtype) case. Writes the merged CSV and its chart.

    python benchmarks/merge_results.py OUT.csv BASE.csv NEWER.csv [NEWER2.csv ...] [--by-impl]

``--by-impl``: a newer row replaces only the row of the same (op, shape, dtype, impl), so a
run of one implementation (``ditfuse bench --impls copy``) updates that column and keeps the
case's other rows.
"""

import csv
import sys

from ditfuse.tools.bench import COLUMNS, _chart, _write_csv


def _read(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for c in ("us", "gbps", "pct_copy"):
            r[c] = float(r[c])
    return rows


def main(out, base, *newer):
    by_impl = "--by-impl" in newer
    newer = [p for p in newer if p != "--by-impl"]
    cols = ("op", "shape", "dtype", "impl") if by_impl else ("op", "shape", "dtype")
    rows = _read(base)
    for path in newer:
        new = _read(path)
        cases = {tuple(r[c] for c in cols) for r in new}
        rows = [r for r in rows if tuple(r[c] for c in cols) not in cases] + new
    rows = [{c: r.get(c) or "" for c in COLUMNS} for r in rows]  # older CSVs: fewer columns
    _write_csv(rows, out)
    _chart(rows, out[:-4] + ".png")
    print(f"{out}: {len(rows)} rows")


if __name__ == "__main__":
    main(*sys.argv[1:])
