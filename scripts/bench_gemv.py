#!/usr/bin/env python
"""The decode step's projections on a GPU: cuBLAS (F.linear) against kvbench's GEMV kernel
(kvbench/kernels/gemv.py), at Llama-3.1-8B shapes, in CUDA graphs.

Each timed unit is what the decode step runs: an RMSNorm (a Triton kernel that releases
its dependents at its start under PDL) and then the projection of its output. Units cycle
through enough weight copies that L2 (50 MB on an H200) holds none of them. Reported:
microseconds per unit and the weights' bytes over that time.

    python scripts/bench_gemv.py                      # defaults, with and without PDL
    python scripts/bench_gemv.py --tune               # also a sweep of the kernel's launch knobs
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_kernels import time_graph  # median microseconds per closure, replayed in one CUDA graph

from kvbench.kernels.fused_ops import rmsnorm
from kvbench.kernels.gemv import gemv_config, linear
from kvbench.kernels.launch import programmatic_launch

SHAPES = {
    "qkv": (6144, 4096),
    "o": (4096, 4096),
    "gate_up": (28672, 4096),
    "down": (4096, 14336),
    "lm_head": (128256, 4096),
}


def units_for(name, rows, impl, knobs, pdl, dev):
    n, k = SHAPES[name]
    nbytes = n * k * 2
    copies = max(2, math.ceil(240e6 / nbytes))
    ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    xs = [torch.randn(rows, 1, k, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
    norm = torch.ones(k, device=dev, dtype=torch.bfloat16)
    hs = [torch.empty_like(x) for x in xs]
    ys = [torch.empty(rows, 1, n, device=dev, dtype=torch.bfloat16) for _ in range(copies)]

    def unit(i):
        def run():
            with programmatic_launch(pdl):
                rmsnorm(xs[i], norm, 1e-5, out=hs[i])
                if impl == "cublas":
                    torch.matmul(hs[i], ws[i].t(), out=ys[i])
                else:
                    linear(hs[i], ws[i], out=ys[i], **knobs)

        return run

    units = [unit(i) for i in range(copies)] * max(1, 8 // copies)
    us = time_graph(units, reps=20)
    # the check: the kernel's result against cuBLAS on one copy
    ref = F.linear(hs[0].float(), ws[0].float())
    err = ((ys[0].float() - ref).abs().max() / ref.abs().max()).item()
    ws.clear()  # the copies go back to the allocator before the next variant
    return us, nbytes, err


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tune", action="store_true", help="sweep BLOCK_N x BLOCK_K x stages x warps (with PDL)")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--rows", default="1,16")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    p = torch.cuda.get_device_properties(dev)
    print(f"{p.name}, {p.multi_processor_count} SMs, torch {torch.__version__}")
    print(f"{'shape':8} {'rows':>4} {'impl':34} {'us':>8} {'TB/s':>6} {'rel err':>8}")
    for name, rows in itertools.product(args.shapes.split(","), [int(r) for r in args.rows.split(",")]):
        n, k = SHAPES[name]
        variants = [("cublas", {}, False), ("cublas", {}, True), ("triton", {}, False), ("triton", {}, True)]
        variants.append(("triton", {"PREFETCH_K": 0}, True))
        if args.tune:
            for bn, bk, st, w in itertools.product((16, 32, 64), (128, 256), (3, 4, 6), (4,)):
                if (bn + 16) * bk * 2 * st > 220_000:  # weights + x tiles past the shared memory
                    continue
                variants.append(("triton", {"BLOCK_N": bn, "BLOCK_K": bk, "num_stages": st, "num_warps": w}, True))
        results = []
        for impl, knobs, pdl in variants:
            try:
                us, nbytes, err = units_for(name, rows, impl, knobs, pdl, dev)
            except Exception as exc:  # a config past the shared memory: skipped, said
                print(f"{name:8} {rows:4} {impl} {knobs} FAILED {type(exc).__name__}: {str(exc)[:120]}")
                continue
            cfg = {**gemv_config(n, k, dev), **knobs} if impl == "triton" else {}
            label = f"{impl}{' pdl' if pdl else ''} {' '.join(f'{a}={b}' for a, b in knobs.items())}".strip()
            results.append((us, label, cfg))
            if not args.tune or len(results) <= 5:
                print(f"{name:8} {rows:4} {label:34} {us:8.2f} {nbytes / us / 1e6:6.2f} {err:8.1e}")
        if args.tune:
            best = sorted(results[5:])[:5]
            print(f"{name:8} {rows:4} best: " + "; ".join(f"{lbl} {us:.2f}" for us, lbl, _ in best))
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
