"""Merge benchmark CSVs of one GPU and day: rows of later files replace the earlier rows of
the same (op, shape, dtype) case. Writes the merged CSV and its chart.

    python benchmarks/merge_results.py OUT.csv BASE.csv NEWER.csv [NEWER2.csv ...]
"""
import csv
import sys

from ditfuse.bench import COLUMNS, _chart, _write_csv


def _read(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for c in ("us", "gbps", "pct_copy"):
            r[c] = float(r[c])
    return rows


def main(out, base, *newer):
    rows = _read(base)
    for path in newer:
        new = _read(path)
        cases = {(r["op"], r["shape"], r["dtype"]) for r in new}
        rows = [r for r in rows if (r["op"], r["shape"], r["dtype"]) not in cases] + new
    rows = [{c: r[c] for c in COLUMNS} for r in rows]
    _write_csv(rows, out)
    _chart(rows, out[:-4] + ".png")
    print(f"{out}: {len(rows)} rows")


if __name__ == "__main__":
    main(*sys.argv[1:])
