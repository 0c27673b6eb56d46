#!/usr/bin/env python
"""Draw the layer tails that scripts/exp/tail_stamps.py measured, one bar per mode and file.

    python scripts/exp/stamps_plot.py base=stamps-base.txt def=stamps-def.txt -o tails.png

Each bar runs from the layer's first split program past its wait (0 us) and shows where the median
split program ends (split_p50), the last one ends (split_end), the reduction's wait returns (red_wait)
and its last store lands (red_end): the split kernel, the release, then the merge. Labels name the
files (LABEL=PATH).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

PHASES = (  # (column ending the segment, label, colour)
    ("split_p50", "split kernel, to its median program", "#9ecae1"),
    ("split_end", "to its last program", "#3182bd"),
    ("red_wait", "reduction's wait returns", "#fdae6b"),
    ("red_end", "merge, to the last store", "#e6550d"),
)


def read_stamps(path: Path) -> dict[str, dict[str, float]]:
    """{mode: {column: us}} from a tail_stamps.py table (comment lines start with #)."""
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    head = lines[0].split()
    cols = ["mode", "plain_ms", *head[3:]]  # "mode plain ms stamped ...": "plain ms" is one column
    out = {}
    for ln in lines[1:]:
        cells = ln.split()
        try:
            out[cells[0]] = {c: float(v) for c, v in zip(cols[1:], cells[1:])}
        except ValueError:
            continue
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="LABEL=PATH of a tail_stamps.py output")
    ap.add_argument("-o", "--out", required=True, help="the PNG to write")
    args = ap.parse_args(argv)
    rows = []
    for item in args.files:
        label, _, path = item.rpartition("=")
        try:
            table = read_stamps(Path(path))
        except OSError as exc:
            print(f"stamps_plot: {exc}", file=sys.stderr)
            return 2
        rows += [(f"{mode} ({label or Path(path).stem})", t) for mode, t in table.items()]
    rows.sort(key=lambda r: r[0])
    fig, ax = plt.subplots(figsize=(9, 0.4 * len(rows) + 2.0))
    for y, (_, t) in enumerate(rows):
        start = 0.0
        for col, label, colour in PHASES:
            ax.barh(y, t[col] - start, left=start, color=colour, label=label if y == 0 else None)
            start = t[col]
        ax.text(start + 0.1, y, f"{t['red_end']:.2f}", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=8)
    ax.invert_yaxis()
    first = min(t["split_p50"] for _, t in rows)  # the tail is what differs: the axis starts near it
    ax.set_xlim(max(0.0, first - 1.5), max(t["red_end"] for _, t in rows) + 0.6)
    ax.set_xlabel("us from the layer's first split program past its wait (axis cut on the left)")
    ax.set_title("Attention of one layer in the captured decode step (means over layers)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
