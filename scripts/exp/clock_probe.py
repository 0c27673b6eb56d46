#!/usr/bin/env python
"""SM clock, power and throttle reasons while the captured decode step runs (a CUDA GPU).

    python scripts/exp/clock_probe.py --modes fp16,int8,fp16,int8 --context 32768 --batch 16

Question: int8 at batch 16, 32K loses 0.4-0.7 ms a step on the clock that no kernel accounts
for (results/2026-12-01h-h200/profile-32k-b16.txt), and its ratio to fp16 moves between leases
(1.415x-1.486x) while fp16's speed does not. If the GPU lowers its SM clock under int8's heavier
arithmetic (power), the step slows without any launch gap. Per mode: the step time with steps
queued back to back, then with the GPU left idle 20 ms between steps (each step timed alone by
CUDA events), and NVML samples (every 20 ms) of the SM clock, the power and the clock event reasons.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import pynvml
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # scripts/, for profile_step

from profile_step import open_session, warm_decoder

from kvbench.kernels.decode_attention import CONFIG_ENV
from kvbench.session import Session


class Sampler:
    """NVML samples in a thread: (SM MHz, watts, clock event reasons bitmask)."""

    def __init__(self, index: int = 0, period: float = 0.02) -> None:
        pynvml.nvmlInit()
        self.h = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.period = period
        self.samples: list[tuple[int, float, int]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            clock = pynvml.nvmlDeviceGetClockInfo(self.h, pynvml.NVML_CLOCK_SM)
            watts = pynvml.nvmlDeviceGetPowerUsage(self.h) / 1000
            try:
                reasons = pynvml.nvmlDeviceGetCurrentClocksEventReasons(self.h)
            except AttributeError:
                reasons = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(self.h)
            self.samples.append((clock, watts, reasons))
            time.sleep(self.period)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()

    def summary(self) -> str:
        if not self.samples:
            return "no samples"
        clocks = [s[0] for s in self.samples]
        watts = [s[1] for s in self.samples]
        reasons = {}
        for s in self.samples:
            reasons[s[2]] = reasons.get(s[2], 0) + 1
        rs = ", ".join(f"{k:#x} x{v}" for k, v in sorted(reasons.items()))
        return (f"SM MHz median {statistics.median(clocks):.0f} (min {min(clocks)}, max {max(clocks)}); "
                f"W median {statistics.median(watts):.0f} (max {max(watts):.0f}); reasons {rs}")  # fmt: skip


def probe(s: Session, name: str, ctx: int, batch: int, seconds: float) -> None:
    """`name`: a mode, or "<mode>:<knob>=<value>" for one launch override (KVBENCH_ATTN_CONFIG)."""
    mode, _, knob = name.partition(":")
    if knob:
        key, _, value = knob.partition("=")
        with contextlib.suppress(ValueError):  # numbers and booleans as JSON ("8", "true"), else a string
            value = json.loads(value)
        os.environ[CONFIG_ENV] = json.dumps({mode: {key: value}})
    else:
        os.environ.pop(CONFIG_ENV, None)
    steps_cap = 1000
    dec, caches = warm_decoder(s, mode, ctx, batch, ctx + steps_cap)
    # back to back, for about `seconds`
    with Sampler() as smp:
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds and dec.steps < steps_cap - 200:
            for _ in range(10):
                dec.step()
            torch.cuda.synchronize()
            n += 10
        wall_ms = (time.perf_counter() - t0) * 1e3 / n
    print(f"{name:12s} back to back: {n} steps, {wall_ms:.3f} ms/step; {smp.summary()}")
    # idle gaps: each step alone, 20 ms apart
    times = []
    with Sampler() as smp:
        for _ in range(40):
            time.sleep(0.02)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dec.step()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
    print(f"{name:12s} 20 ms apart:   {statistics.median(times):.3f} ms/step (min {min(times):.3f}); {smp.summary()}")
    del dec, caches
    torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="dummy:llama-3.1-8b")
    ap.add_argument("--modes", default="fp16,int8,fp16,int8")
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=6.0)
    args = ap.parse_args()
    modes = args.modes.split(",")
    plain = list(dict.fromkeys(m.partition(":")[0] for m in modes))
    s = open_session(args.model, plain, args.context, args.batch, "clock_probe.py")
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    print(f"# {torch.cuda.get_device_name()}, max SM clock {pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)} "
          f"MHz, power limit {pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1000:.0f} W; context {args.context}, batch {args.batch}")  # fmt: skip
    for m in modes:
        probe(s, m, args.context, args.batch, args.seconds)


if __name__ == "__main__":
    main()
