#!/usr/bin/env python
"""Where a layer's attention ends: per-program global-timer stamps in the captured decode step (a CUDA GPU).

    python scripts/exp/tail_stamps.py --modes fp16,turbo4-asym --context 8192 --batch 1

Question (twelfth session): at 8K, batch 1, turbo4-asym, turbo3-asym and delegated miss fp16's speed by
0.4-0.5%. Their split kernels take no longer than fp16's, but the reduction ends 0.6-0.7 us a layer later
after the split kernel than fp16's does (torch.profiler, eighth session), and neither the merge's passes,
the transforms nor the write account for it. Is the extra time before the reduction's wait returns (the
split grid's last programs, its completion) or after (the merge)?

Every decode_attention launch stores %globaltimer (ns, one clock for all SMs) per program
(`decode_attention.record_stamps`): each split program after its wait and after its stores; each reduction
program at its start, after its wait and after its output store. Per replayed step and layer, relative to
the layer's first split program past its wait (t0):
  split_end   the last split program's stores issued      split_p50  the median program's
  red_wait    the first reduction program past its wait   red_end    the last reduction program's store
  next_t0     the next layer's t0 (the layer's whole cycle)
and the tail = red_end - split_end. Means over layers 2..n-3 (the turbo modes keep the first and last two in
fp16), medians over steps. The stamps add two stores a program; the step time with and without them is
printed beside.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for profile_step

from profile_step import open_session, warm_decoder

from kvbench.kernels.decode_attention import record_stamps


def step_ms(dec, n: int = 20) -> float:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        dec.step()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / n


def layer_times(buf: torch.Tensor) -> list[dict]:
    """Per layer, the stamps of one step as us from the layer's t0."""
    out = []
    host = buf.cpu()
    for layer in range(host.shape[0]):
        sp, rd = host[layer, 0], host[layer, 1]
        sp = sp[sp[:, 0] > 0]
        rd = rd[rd[:, 0] > 0]
        t0 = int(sp[:, 0].min())
        us = lambda t, t0=t0: (int(t) - t0) / 1e3  # noqa: E731
        out.append({
            "t0": t0, "programs": len(sp), "split_start_max": us(sp[:, 0].max()), "split_end": us(sp[:, 1].max()),
            "split_p50": us(sp[:, 1].median()), "red_start": us(rd[:, 0].min()), "red_wait": us(rd[:, 1].min()),
            "red_wait_max": us(rd[:, 1].max()), "red_end": us(rd[:, 2].max()),
        })  # fmt: skip
    for a, b in itertools.pairwise(out):
        a["next_t0"] = (b["t0"] - a["t0"]) / 1e3
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="dummy:llama-3.1-8b")
    ap.add_argument("--modes", default="fp16,turbo4-asym,turbo3-asym,turbo4-delegated,int8")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    modes = args.modes.split(",")
    s = open_session(args.model, list(dict.fromkeys(modes)), args.context, args.batch, "tail_stamps.py")
    n_layers = s.lm.args.n_layers
    print(f"# {torch.cuda.get_device_name()}; context {args.context}, batch {args.batch}; {n_layers} layers; "
          f"us from the layer's first split program past its wait; mean over layers 2..{n_layers - 3}, median over "
          f"{args.steps} steps")  # fmt: skip
    keys = ("programs", "split_start_max", "split_p50", "split_end", "red_start", "red_wait", "red_wait_max",
            "red_end", "next_t0")  # fmt: skip
    print(f"{'mode':18s} {'plain ms':>8s} {'stamped':>8s} " + " ".join(f"{k:>15s}" for k in keys) + f" {'tail':>6s}")
    for mode in modes:
        capacity = args.context + 16 + 20 * args.steps + 64
        dec, caches = warm_decoder(s, mode, args.context, args.batch, capacity)
        plain = step_ms(dec)
        del dec
        buf = torch.zeros(n_layers, 2, 4096, 4, dtype=torch.int64, device=s.device)
        with record_stamps(buf):  # the graph captured inside keeps the stamps' addresses
            dec, _ = warm_decoder(s, mode, args.context, args.batch, capacity)
        stamped = step_ms(dec)
        rows = []
        for _ in range(args.steps):
            buf.zero_()
            dec.step()
            torch.cuda.synchronize()
            rows.append(layer_times(buf))
        inner = range(2, n_layers - 2)
        agg = {}
        for k in keys:
            per_step = [statistics.fmean(r[layer][k] for layer in inner if k in r[layer]) for r in rows]
            agg[k] = statistics.median(per_step)
        tail = statistics.median(
            statistics.fmean(r[layer]["red_end"] - r[layer]["split_end"] for layer in inner) for r in rows
        )
        diffs = sorted({int(x) for x in buf[2, 0, :, 1].cpu().tolist() if x > 0})
        res = min((b - a for a, b in itertools.pairwise(diffs) if b > a), default=0)
        print(f"{mode:18s} {plain:8.3f} {stamped:8.3f} " + " ".join(f"{agg[k]:15.2f}" for k in keys) + f" {tail:6.2f}"
              f"   (timer step seen: {res} ns)")  # fmt: skip
        del dec, caches
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
