#!/usr/bin/env python
"""What raw turbo4's targets ask of its attention kernel, from measurements of one H200.

    python scripts/exp/turbo4_budget.py                      # the seventeenth session's files
    python scripts/exp/turbo4_budget.py --bench B.csv --kernels K.txt --ncu N1.txt N2.txt

Inputs (all measured; scripts/exp/turbo4-budget.sh and maxnreg.sh make them):
- `--bench`: a decode-bench CSV with fp16 and turbo4 rows at one context, batch 1 and 16 (step_ms);
- `--kernels`: scripts/bench_kernels.py output, one layer's attention + append alone (us) for fp16 and
  turbo4 at that context and batches;
- `--ncu`: Nsight Compute output on `_decode_split_kernel` with `smsp__inst_executed.sum`: the
  split kernels at the launch defaults (turbo4: 64-thread programs, fp16: 128), grid = (batch x Hkv,
  splits). A later file's kernel replaces an earlier one's of the same (mode, batch).

The step model: a step is the same non-attention work for every mode plus one attention per layer,
fp16's in the `--layers - --turbo-layers` boundary layers (turbo modes keep the first and last two in
fp16). From fp16's step and its attention alone, the rest of the step is `other`; a target ratio R
then leaves each turbo4 layer (fp16's step / R - other - boundary layers) / turbo layers of time. That
time is compared with what turbo4 spends now (its attention alone, plus its in-step overhead: the
measured step minus the model), with the bytes its cache holds (at the copy bandwidth of the bench
CSV), and with the instructions its split kernel executes (at 4 warp schedulers per SM, one issue a
cycle each, at the SM clock ncu saw).
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "results/2026-12-03-h200"
SCHEDULERS = 4  # warp schedulers per SM on Hopper, one instruction issued per cycle each at most
TOKEN_HEAD_BYTES = 132  # turbo4 at D = 128: 64 + 64 bytes of 4-bit codes, two fp16 norms


def read_kernels(path) -> dict:
    """{(mode, batch, context): us} from bench_kernels output lines."""
    out = {}
    for line in Path(path).read_text().splitlines():
        m = re.match(r"\s*(\d+)\s+(\d+)\s+(\S+)\s+([\d.]+)\s", line)
        if m:
            out[(m.group(3), int(m.group(1)), int(m.group(2)))] = float(m.group(4))
    return out


def read_ncu(paths, n_kv_heads: int) -> dict:
    """{(mode, batch): {inst, us, ghz, issue, sms, splits}} of the split kernels in ncu outputs."""
    out = {}
    for path in paths:
        blocks = re.split(r"\n(?=\s+_decode_split_kernel \()", Path(path).read_text())
        for blk in blocks:
            head = re.match(r"\s+_decode_split_kernel \((\d+), (\d+), 1\)x\((\d+), 1, 1\)", blk)
            if not head:
                continue
            rows, splits, threads = (int(g) for g in head.groups())

            def num(pattern, blk=blk):
                m = re.search(pattern + r"\s+\S+\s+([\d,.]+)", blk)
                return float(m.group(1).replace(",", "")) if m else None

            mode = {64: "turbo4", 128: "fp16"}.get(threads)
            if mode is None:
                continue
            out[(mode, rows // n_kv_heads)] = {
                "inst": num(r"smsp__inst_executed\.sum"),
                "us": num(r"Duration"),
                "ghz": num(r"SM Frequency"),
                "issue": num(r"One or More Eligible") / 100,
                "sms": num(r"# SMs"),
                "splits": splits,
            }
    return out


def read_bench(path) -> dict:
    """{(mode, batch): row} of a decode-bench CSV (effective mode, the rows that ran)."""
    with open(path) as f:
        return {(r["effective_mode"], int(r["batch"])): r for r in csv.DictReader(f) if r["status"] == "ok"}


def layer_budget(step16_ms, attn16_us, target, layers, turbo_layers):
    """(other ms, us a turbo layer may take in the step for `target` x fp16's speed)."""
    other = step16_ms - layers * attn16_us / 1000
    allowed = (step16_ms / target - other - (layers - turbo_layers) * attn16_us / 1000) / turbo_layers
    return other, allowed * 1000


def budget(bench, kernels, ncu, context, batch, target, layers=32, turbo_layers=28, n_kv_heads=8) -> dict:
    f16, t4 = bench[("fp16", batch)], bench[("turbo4", batch)]
    step16, step4 = float(f16["step_ms"]), float(t4["step_ms"])
    a16, a4 = kernels[("fp16", batch, context)], kernels[("turbo4", batch, context)]
    other, allowed = layer_budget(step16, a16, target, layers, turbo_layers)
    model4 = other + ((layers - turbo_layers) * a16 + turbo_layers * a4) / 1000
    overhead = (step4 - model4) * 1000 / turbo_layers  # us a turbo layer costs in the step beyond its attention
    th = batch * context * n_kv_heads  # (token, kv head) pairs a layer reads
    k = ncu[("turbo4", batch)]
    slots = allowed * 1e-6 * k["sms"] * SCHEDULERS * k["ghz"] * 1e9 / th  # issue slots per pair at 100%
    inst = k["inst"] / th
    return {
        "batch": batch,
        "target": target,
        "ratio_now": step16 / step4,
        "other_ms": other,
        "turbo_layer_now_us": a4 + overhead,
        "attn_alone_us": a4,
        "overhead_us": overhead,
        "allowed_us": allowed,
        "bytes_us": th * TOKEN_HEAD_BYTES / (float(f16["bandwidth_gbs"]) * 1e3),
        "inst_per_pair": inst,
        "issue_now": k["issue"],
        "slots_per_pair": slots,
        "issue_needed": inst / slots,
        "fp16_inst_per_pair": ncu[("fp16", batch)]["inst"] / th if ("fp16", batch) in ncu else float("nan"),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", default=str(RUN / "maxnreg/run-1/bench.csv"))
    ap.add_argument("--kernels", default=str(RUN / "kernels.txt"))
    ap.add_argument("--ncu", nargs="+", default=[str(RUN / "ncu-split.txt"), str(RUN / "ncu-split-b1.txt")])
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--targets", default="1:1.12,16:2.0", help="batch:ratio pairs (the issue's turbo4 targets)")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--turbo-layers", type=int, default=28)
    args = ap.parse_args(argv)
    try:
        bench, kernels = read_bench(args.bench), read_kernels(args.kernels)
        ncu = read_ncu(args.ncu, 8)
        rows = [
            budget(bench, kernels, ncu, args.context, int(b), float(r), args.layers, args.turbo_layers)
            for b, r in (t.split(":") for t in args.targets.split(","))
        ]
    except (OSError, KeyError, TypeError, ValueError) as exc:
        print(f"turbo4_budget: missing or unreadable input: {exc!r}", file=sys.stderr)
        return 2
    print(f"turbo4 at {args.context} tokens, {args.turbo_layers} of {args.layers} layers turbo4 (the rest fp16)")
    for r in rows:
        print(
            f"\nbatch {r['batch']}: turbo4 at {r['ratio_now']:.3f}x of fp16; target {r['target']}x\n"
            f"  the rest of the step (fp16's step less its attention): {r['other_ms']:.3f} ms\n"
            f"  a turbo4 layer now: {r['turbo_layer_now_us']:.1f} us (attention + append alone "
            f"{r['attn_alone_us']:.1f}, in-step overhead {r['overhead_us']:.1f})\n"
            f"  a turbo4 layer may take: {r['allowed_us']:.1f} us; its cache's bytes at copy bandwidth: "
            f"{r['bytes_us']:.1f} us\n"
            f"  split kernel: {r['inst_per_pair']:.1f} warp instructions per (token, kv head) (fp16's "
            f"{r['fp16_inst_per_pair']:.1f}), issued on {r['issue_now']:.1%} of scheduler cycles\n"
            f"  the allowed time holds {r['slots_per_pair']:.1f} issue slots per (token, kv head): the "
            f"current instruction count needs {r['issue_needed']:.0%} of them issued"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
