#!/usr/bin/env python3
"""One line per decode-bench CSV for the experiment scripts: mode@context/batch=tok/s(ratio to fp16).

python3 scripts/exp/bench_summary.py OUT/run-1/bench.csv
"""

import csv
import sys

with open(sys.argv[1]) as f:
    rows = [r for r in csv.DictReader(f) if r["decode_tok_s"]]
cells = (
    f"{r['kv_cache_mode']}@{int(r['context_tokens']) // 1024}k/{r['batch']}="
    f"{float(r['decode_tok_s']):.1f}({float(r['decode_ratio_vs_fp16'] or 1):.4f})"
    for r in rows
)
print("  " + " ".join(cells))
