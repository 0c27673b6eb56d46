"""Time decode-bench cells of one mode without fp16's beside them (twenty-seventh session).

decode-bench always runs fp16 first, as the reference of every ratio; at batches where fp16 does not fit (32K,
batch 31 and up on Llama-3.1-8B) that cell runs out of memory and a large quantized batch after it can too. This
script opens one session for one mode and times the cells it is given, in the given order, each under its own
KVBENCH_ATTN_CONFIG, with decode-bench's own measurement (`BenchJob._measure`: random K/V fill, warmup, the
median of `repeats` windows). It prints tok/s per cell, or the error.

Usage (GPU): python scripts/exp/time_cells.py --mode turbo4 --context 32768 --batches 64,87 \
    --variant def='{}' --variant wave='{"turbo4": {"wave": 8}}' --order def,wave,wave,def
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from kvbench.bench import BenchJob
from kvbench.config import BenchConfig
from kvbench.kernels.decode_attention import CONFIG_ENV
from kvbench.runtime import Progress, is_oom, measure_bandwidth, one_line, release
from kvbench.session import Session
from kvbench.sweep import Sweep


class _NoSink:
    def row(self, row: dict) -> None:
        pass

    def start(self, cell: dict) -> None:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="dummy:llama-3.1-8b")
    ap.add_argument("--mode", required=True)
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--batches", default="64")
    ap.add_argument("--variant", action="append", default=[], help="NAME=JSON for KVBENCH_ATTN_CONFIG")
    ap.add_argument("--order", default="def", help="comma list of variant names, run per batch in this order")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    variants = dict(v.split("=", 1) for v in args.variant) or {"def": "{}"}
    batches = [int(b) for b in args.batches.split(",")]
    cfg = BenchConfig(model=args.model, modes=[args.mode], contexts=[args.context], batch=batches, no_fallback=True,
                      warmup=args.warmup, gen=args.gen, repeats=args.repeats, quiet=True)  # fmt: skip
    s = Session.open(cfg, "decode-bench", log=lambda m: print(f"# {m}"))
    job = BenchJob(s, Progress(0, True), Sweep(_NoSink()))
    job.bandwidth = measure_bandwidth(s.device)
    for batch in batches:
        for name in args.order.split(","):
            os.environ[CONFIG_ENV] = variants[name]
            t0 = time.time()
            try:
                row = job._measure(s.resolve(args.mode).effective, args.context, batch, [])
                got = f"{row['decode_tok_s']:.1f} tok/s (min {row['decode_tok_s_min']:.1f}, max {row['decode_tok_s_max']:.1f})"
            except Exception as exc:  # an experiment: record and go on
                got = ("out of memory: " if is_oom(exc) else "error: ") + one_line(exc)[:160]
            finally:
                release(s.device)
            print(f"{args.mode} {args.context} batch {batch} {name}: {got} ({time.time() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
