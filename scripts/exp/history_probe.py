"""Does a bf16 result at 32K depend on what the process ran before? (twenty-eighth session)

`repro_probe.py` found fp16's greedy tokens at 32K (bf16, reference path, as the audit forces them) differ on one
machine between a process that ran 8K first and one that ran 2K and 8K first; on the CPU they do not. This
prints, per context in --order: digests of the prefill's stored K/V, of the prefill's last logits and of the
greedy tokens, under --sdpa (default: what the code picks, i.e. torch's choice before 9e016e0 and the reference
decode without cuDNN from it on; math / efficient / cudnn / flash: that backend only).

Usage (GPU): python scripts/exp/history_probe.py --model M.gguf --order 2048,32768 [--sdpa math]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from path_gap import digest as full_digest
from path_gap import open_session, prompt_ids

from kvbench.engine.generate import greedy_decode, prefill
from kvbench.engine.weights import fit_context

digest = functools.partial(full_digest, length=12, as_float=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--order", default="32768")
    ap.add_argument("--sdpa", default="default", choices=["default", "math", "efficient", "cudnn", "flash"])
    ap.add_argument("--gen", type=int, default=64)
    args = ap.parse_args()
    backend = {"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}.get(args.sdpa)  # fmt: skip
    s = open_session(args.model, "bfloat16", ["fp16"])
    with sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext():
        for ctx in map(int, args.order.split(",")):
            fit_context(s.lm, ctx, s.cfg.yarn)
            ids = prompt_ids(s, ctx)
            t0 = time.perf_counter()
            caches = s.caches("fp16", capacity=ids.shape[1] + args.gen, kernel="reference")
            first = prefill(s.lm.model, ids, caches, s.cfg.prefill_chunk)
            kv = digest(*(x for c in caches for x in c.dequantized()))
            tokens = greedy_decode(s.lm.model, first, caches, args.gen)[0]
            print(f"sdpa={args.sdpa:<9} order={args.order:<20} ctx={ctx:>6} prefill-kv {kv} last-logits "
                  f"{digest(first)} tokens {digest(tokens)} {time.perf_counter() - t0:.1f} s", flush=True)  # fmt: skip
            del caches, first
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
