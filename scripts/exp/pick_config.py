#!/usr/bin/env python3
"""The fastest timed launch config of one mode and shape, across scripts/bench_kernels.py CSVs, as the
KVBENCH_ATTN_CONFIG JSON that has decode-bench launch it (a fixed split count); "{}" where the mode's
default was the fastest or the shape is missing. A line on stderr says which and by how much.

python3 scripts/exp/pick_config.py fp16 16 2048 OUT/rows/kernels.csv OUT/wide/kernels.csv
"""

import csv
import json
import sys

mode, batch, context, *paths = sys.argv[1:]
rows = []
for path in paths:
    try:
        with open(path) as f:
            rows += [
                r
                for r in csv.DictReader(f)
                if r["batch"] == batch and r["context"] == context and r["kernel"] in (mode, f"{mode} (tuned)")
            ]
    except FileNotFoundError:
        print(f"pick_config: {path} missing", file=sys.stderr)
default = [float(r["us"]) for r in rows if r["kernel"] == mode]
tuned = [r for r in rows if r["kernel"] != mode]
if not default or not tuned:
    print(f"pick_config: no timed {mode} at batch {batch}, {context} tokens", file=sys.stderr)
    print("{}")
    sys.exit(0)
best = min(tuned, key=lambda r: float(r["us"]))
base = min(default)  # each CSV timed the default once
gain = base / float(best["us"])
knobs = {k: int(best[k]) for k in ("block_n", "num_warps", "num_stages")}
knobs["splits"] = int(best["num_splits"])
print(f"pick_config: {mode} B={batch} L={context}: default {base:.1f} us, best {best['us'][:6]} us ({gain:.3f}x) {knobs}",
      file=sys.stderr)  # fmt: skip
print(json.dumps({mode: knobs}) if gain > 1.0 else "{}")
