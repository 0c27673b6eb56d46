#!/usr/bin/env python
"""How much V could sparse V skip? The real softmax weights of one decode step, on the reference path.

    python scripts/exp/sparse_v_share.py --contexts 2k,8k --taus 1e-6,1e-4

Prefills the audit's prompt (fp16 cache, CPU or GPU), decodes one token and, in every layer, reads
the weights w of that step (each query head over every stored token). Prints per context and tau:
- `tokens`: the share of (query head, token) weights below tau: what the exact rule skips (the
  reference path does exactly this);
- `blocks`: the share of 128-token blocks (from token 0, per kv head) in which every query head
  of the group has exp(s - M) < tau, M being the row's maximum over all tokens. The split kernel
  decodes no V in such a block at best: it tests against its split's running maximum (<= M), so it
  skips fewer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import kvbench.kv.base as kv_base
from kvbench.config import parse_int_list
from kvbench.engine.generate import make_stepper, prefill
from kvbench.engine.weights import load_model
from kvbench.kv import build_caches
from kvbench.prompts import build_prompt, synthetic_prompt


def shares(q, k, scale, taus, block=128):
    """{tau: (token share, block share)} for one layer's step: q [B, Hq, 1, D], k [B, Hkv, T, D]."""
    b, hq, _, d = q.shape
    hk, t = k.shape[1], k.shape[2]
    s = (q.float().view(b, hk, hq // hk, d) @ k.float().transpose(-1, -2)) * scale  # [B, Hkv, G, T]
    w = torch.softmax(s, -1)
    gap = s - s.amax(-1, keepdim=True)  # ln of exp(s - M)
    pad = (-t) % block
    gap = torch.nn.functional.pad(gap, (0, pad), value=-torch.inf).unflatten(-1, (-1, block))
    best = gap.amax(-1).amax(2)  # [B, Hkv, blocks]: the block's largest gap over the group
    return {
        tau: ((w < tau).float().mean().item(), (best < torch.log(torch.tensor(tau))).float().mean().item())
        for tau in taus
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model spec as for kvbench (default: the embedded SmolLM2)")
    ap.add_argument("--contexts", default="2k,8k")
    ap.add_argument("--taus", default="1e-6,1e-4")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    taus = [float(x) for x in args.taus.split(",")]
    dtype = torch.bfloat16
    lm = load_model(args.model, device=args.device, dtype=dtype)
    a = lm.args
    seen = []
    plain = kv_base.sdpa

    def spy(q, k, v, scale, sparse_v=0.0):
        if q.shape[2] == 1:
            seen.append(shares(q, k, scale, taus))
        return plain(q, k, v, scale, sparse_v)

    kv_base.sdpa = spy
    print("context  tau      tokens below tau  blocks skippable at best")
    for ctx in parse_int_list(args.contexts, "contexts"):
        if lm.tokenizer is not None:
            ids = build_prompt(lm.tokenizer, ctx).to(args.device)
        else:
            ids = synthetic_prompt(a.vocab_size, ctx).to(args.device)
        caches = build_caches(
            "fp16", n_layers=a.n_layers, batch=1, n_kv_heads=a.n_kv_heads, head_dim=a.head_dim,
            dtype=dtype, device=args.device, capacity=ctx + 2,
        )  # fmt: skip
        with torch.no_grad():
            lm.model.set_rope(a.hf_config)
            first = prefill(lm.model, ids, caches, 2048)
            seen.clear()
            make_stepper(lm.model, caches, fused=False)(first.argmax(-1, keepdim=True))
        for tau in taus:
            tok = sum(x[tau][0] for x in seen) / len(seen)
            blk = sum(x[tau][1] for x in seen) / len(seen)
            print(f"{ctx:>7}  {tau:<7g}  {tok:>16.1%}  {blk:>24.1%}   (mean over {len(seen)} layers)")


if __name__ == "__main__":
    main()
