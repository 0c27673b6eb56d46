#!/usr/bin/env python
"""GPU time per kernel inside the captured decode step, mode beside mode (a CUDA GPU).

    python scripts/profile_step.py --modes fp16,turbo4-asym --context 8192 --batch 1

For each mode: the dummy model's caches filled with random K/V (as decode-bench does),
a FastDecoder (CUDA graph, PDL, the GEMV kernel), a few warm-up steps, then torch.profiler
over `--steps` graph replays. Prints, per kernel family and per step: launches, summed
GPU time, and the step's wall time measured without the profiler (CUDA events). Under
PDL kernels overlap, so the sums exceed the wall time; "busy" is the union of the
kernels' intervals and "idle" the rest of the step, where no kernel ran; the rows
"idle: A -> B" attribute it to the kernel that ended last before the gap and the one after.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvbench.bench import random_fill
from kvbench.config import BenchConfig
from kvbench.engine.fast_decode import FastDecoder
from kvbench.session import Session

FAMILIES = (  # substring of the kernel name -> family (first match wins)
    ("_decode_split", "attn split"),
    ("_decode_reduce", "attn reduce"),
    ("_rotate", "q rotation"),
    ("_gemv", "gemv"),
    ("rmsnorm", "rmsnorm"),
    ("rope", "rope"),
    ("silu", "silu_mul"),
    ("embedding", "embedding"),
    ("indexSelect", "embedding"),
    ("argmax", "argmax"),
    ("reduce_kernel", "argmax"),
)


def family(name: str) -> str:
    low = name.lower()
    for key, fam in FAMILIES:
        if key.lower() in low:
            return fam
    return name[:48]


def union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def open_session(model: str, modes: list[str], ctx: int, batch: int, script: str, no_fallback: bool = False):
    """decode-bench's Session for one context and batch, quiet; a one-line exit without a GPU."""
    if not torch.cuda.is_available():
        sys.exit(f"error: {script} needs a CUDA GPU (it runs the CUDA-graph decode step)")
    cfg = BenchConfig(model=model, modes=modes, contexts=[ctx], batch=[batch], device="auto",
                      no_fallback=no_fallback, quiet=True)  # fmt: skip
    return Session.open(cfg, "decode-bench", log=lambda *a, **k: None)


def warm_decoder(s: Session, mode: str, ctx: int, batch: int, capacity: int) -> tuple[FastDecoder, list]:
    """A FastDecoder over caches of `capacity` filled with `ctx` random tokens (as decode-bench
    fills them), its graph captured and 8 steps run; and the caches."""
    res = s.resolve(mode)
    caches = s.caches(res.effective, batch=batch, capacity=capacity)
    random_fill(caches, ctx, s.lm.args, s.device, s.dtype)
    dec = FastDecoder(s.lm.model, caches, batch, cuda_graphs=s.cfg.cuda_graphs, pdl=s.cfg.pdl)
    dec.step(torch.randint(3, s.lm.args.vocab_size, (batch, 1), device=s.device))
    for _ in range(7):
        dec.step()
    torch.cuda.synchronize()
    return dec, caches


def profile_mode(s: Session, mode: str, ctx: int, batch: int, steps: int) -> dict:
    dec, caches = warm_decoder(s, mode, ctx, batch, ctx + 16 + 3 * steps + 1)
    t0 = time.perf_counter()
    for _ in range(steps):
        dec.step()
    torch.cuda.synchronize()
    wall_us = (time.perf_counter() - t0) * 1e6 / steps
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            dec.step()
        torch.cuda.synchronize()
    fams: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    events = []
    for e in prof.events():
        if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        start, dur = e.time_range.start, e.time_range.elapsed_us()
        if dur > 0:
            events.append((start, start + dur, family(e.name)))
    events.sort()
    per_step_gemvs = 4 * len(caches) + 1
    n_gemv = 0
    span, prev_end, split_from, last_fam = 0.0, None, None, None
    for a, b, fam in events:
        if fam == "gemv":  # qkv, o, gate_up, down per layer, then the output head
            i = n_gemv % per_step_gemvs
            fam = "gemv lm_head" if i == per_step_gemvs - 1 else f"gemv {('qkv', 'o', 'gate_up', 'down')[i % 4]}"
            n_gemv += 1
        if fam == "attn split" and split_from is None:
            split_from = prev_end if prev_end is not None else a
        if fam == "attn reduce" and split_from is not None:
            span += b - split_from  # from the end of the kernel before the split to the reduction's end
            split_from = None
        if prev_end is not None and a > prev_end:  # nothing ran in between: a launch gap
            gap = fams[f"idle: {last_fam} -> {fam}"]
            gap[0] += 1
            gap[1] += a - prev_end
        fams[fam][0] += 1
        fams[fam][1] += b - a
        if prev_end is None or b > prev_end:
            prev_end, last_fam = b, fam
    fams["attn span (rope end -> reduce end)"] = [0, span]
    busy = union_us([(a, b) for a, b, _ in events]) / steps if events else float("nan")
    del dec, caches
    torch.cuda.empty_cache()
    return {
        "mode": mode,
        "wall_us": wall_us,
        "busy_us": busy,
        "families": {k: (v[0] / steps, v[1] / steps) for k, v in fams.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="dummy:llama-3.1-8b")
    ap.add_argument("--modes", default="fp16,turbo4-asym,turbo3-asym,turbo4-delegated")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--no-fallback", action="store_true")
    args = ap.parse_args()
    s = open_session(args.model, args.modes.split(","), args.context, args.batch, "profile_step.py", args.no_fallback)
    out = [profile_mode(s, m, args.context, args.batch, args.steps) for m in s.modes]
    names = sorted({f for r in out for f in r["families"]}, key=lambda f: -out[0]["families"].get(f, (0, 0))[1])
    print(f"# {s.device}, {args.model}, context {args.context}, batch {args.batch}, "
          f"{args.steps} replays; per step: launches, GPU us (summed)")  # fmt: skip
    head = f"{'kernel':28s}" + "".join(f"{r['mode']:>26s}" for r in out)
    print(head)
    for f in names:
        cells = []
        for r in out:
            n, us = r["families"].get(f, (0, 0.0))
            cells.append(f"{n:7.0f} {us:10.1f} us      ")
        print(f"{f:28s}" + "".join(f"{c:>26s}" for c in cells))
    for key in ("busy_us", "wall_us"):
        print(f"{key:28s}" + "".join(f"{r[key]:>23.1f} us" for r in out))
    print(f"{'idle_us (wall - busy)':28s}" + "".join(f"{r['wall_us'] - r['busy_us']:>23.1f} us" for r in out))


if __name__ == "__main__":
    main()
