#!/usr/bin/env python3
"""The A/B table of an experiment script's runs (scripts/exp/ab-lib.sh's $OUT/r/run-N/bench.csv): each
(mode, context, batch) cell's tok/s per variant and each variant's mean over the first variant's.

python3 scripts/exp/ab_summary.py OUT/r def,one,one,def      (run 1 is def, run 2 one, ...)
"""

import csv
import statistics
import sys
from pathlib import Path


def read_runs(folder: Path, variants: list[str]) -> dict[tuple, dict[str, list[float]]]:
    """{(mode, context, batch): {variant: [tok/s of each of its runs, in run order]}}; a run that left no CSV
    (skipped for time, or killed) is left out."""
    cells: dict[tuple, dict[str, list[float]]] = {}
    for n, variant in enumerate(variants, 1):
        path = folder / f"run-{n}" / "bench.csv"
        if not path.exists():
            continue
        with open(path) as f:
            for r in csv.DictReader(f):
                if r["decode_tok_s"]:
                    key = (r["kv_cache_mode"], int(r["context_tokens"]), int(r["batch"]))
                    cells.setdefault(key, {}).setdefault(variant, []).append(float(r["decode_tok_s"]))
    return cells


def table(cells: dict[tuple, dict[str, list[float]]], variants: list[str]) -> list[str]:
    base, others = variants[0], list(dict.fromkeys(v for v in variants if v != variants[0]))
    head = f"{'mode':16s} {'context':>7s} {'batch':>5s}  " + "  ".join(f"{v + ' tok/s':>22s}" for v in [base, *others])
    lines = [head + "".join(f"  {v + '/' + base:>10s}" for v in others)]
    for (mode, ctx, batch), by in sorted(cells.items()):
        runs = ["/".join(f"{x:.1f}" for x in by.get(v, [])) or "-" for v in [base, *others]]
        ratios = [
            f"{statistics.mean(by[v]) / statistics.mean(by[base]):.4f}" if v in by and base in by else "-"
            for v in others
        ]
        line = f"{mode:16s} {ctx:7d} {batch:5d}  " + "  ".join(f"{x:>22s}" for x in runs)
        lines.append(line + "".join(f"  {x:>10s}" for x in ratios))
    return lines


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    order = sys.argv[2].split(",")
    print("\n".join(table(read_runs(Path(sys.argv[1]), order), order)))
