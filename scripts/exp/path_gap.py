"""Where does the gap in the audit's kernel check come from? (twenty-sixth session)

The audit's `--compare-kernels` runs each mode twice, teacher-forced on fp16's greedy tokens: through the
reference path (the eager model, PyTorch attention) and through the fused GPU path (Triton attention and
append, Triton GEMVs and fused ops, V's inverse rotation folded into W_o, CUDA graphs), and reports the KL
between them. At 32K on the default model it grows with the mode's coarseness (fp16 0.0016 ... turbo3-asym
0.0165, results/2026-12-04-h200). This script takes the fused path apart and sets both paths beside the same
mode run entirely in float32, the yardstick for "as close as bf16 allows".

Per context and mode, the logits [n, V] of:
  ref         reference path, the session's dtype (bf16): what the audit compares against
  triton      fused path, the defaults (the audit's other side)
  nogemv      fused path with cuBLAS projections (--no-gemv-kernel)
  nofold      fused path with V's inverse rotation run by the attention, W_o plain (fold_v off; turbo V only)
  nofold-nogemv   both
  ref32       reference path, the model and cache in float32
  triton32    fused path in float32
Printed: for each, KL(ref || x) in nats, argmax flips, max |logit difference|; and KL(ref32 || x) for
ref, triton and triton32. One table line per (context, mode, variant); --json writes them all.

Usage (GPU): python scripts/exp/path_gap.py --model M.gguf --contexts 2048,32768 --json out.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

import torch

from kvbench import prompts, quality
from kvbench.config import AuditConfig
from kvbench.engine.generate import greedy_decode, make_stepper, prefill, teacher_forced
from kvbench.engine.weights import fit_context
from kvbench.kernels.decode_attention import CONFIG_ENV
from kvbench.session import Session

MODES = "fp16,int8,turbo4-asym,turbo3-asym,turbo4-delegated,turbo4"
TURBO_V = ("turbo4-asym", "turbo3-asym", "turbo4-delegated", "turbo4")


def open_session(model: str, dtype: str, modes: list[str]) -> Session:
    cfg = AuditConfig(model=model, modes=modes, dtype=dtype, no_fallback=True, quiet=True)
    return Session.open(cfg, "audit", log=lambda *a, **k: None)


def logits_of(s: Session, mode: str, ids, forced, *, fused: bool, gemv: bool = True, fold: bool = True):
    """Teacher-forced logits [n, V] (CPU, float32) of one path."""
    eff = s.resolve(mode).effective
    old = os.environ.pop(CONFIG_ENV, None)
    if not fold:
        os.environ[CONFIG_ENV] = json.dumps({eff: {"fold_v": False}})
    try:
        caches = s.caches(eff, capacity=ids.shape[1] + forced.shape[1], kernel="triton" if fused else "reference")
        first = prefill(s.lm.model, ids, caches, s.cfg.prefill_chunk)
        step = make_stepper(s.lm.model, caches, fused=fused, gemv=gemv)
        out = teacher_forced(s.lm.model, first, caches, forced, step=step)[0].float().cpu()
    finally:
        os.environ.pop(CONFIG_ENV, None)
        if old is not None:
            os.environ[CONFIG_ENV] = old
    del caches, step
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def compare(a, b, margin=0.5) -> dict:
    agree = quality.path_agreement(a, b, margin)
    return {
        "kl": agree.kl,
        "flips": agree.flips,
        "worst_margin": agree.worst_margin,
        "max_diff": (a - b).abs().max().item(),
    }


def digest(*tensors, length: int = 16, as_float: bool = False) -> str:
    """The first `length` hex digits of a sha256 over the tensors' bytes (after a cast to float32 with
    `as_float`): what repro_probe.py and history_probe.py print to tell results apart."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach().float() if as_float else t.detach()
        h.update(t.contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:length]


def parse_args(doc: str, modes: str, extra: list[tuple[str, str]] = ()) -> argparse.Namespace:
    """The command line this script, `write_gap.py` and `repro_probe.py` share; `extra`: (flag, default) more."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--contexts", default="2048,32768")
    ap.add_argument("--modes", default=modes)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--json", default=None)
    for flag, default in extra:
        ap.add_argument(flag, default=default)
    return ap.parse_args()


def forced_tokens(s16: Session, ids, gen: int):
    """fp16's greedy tokens on the reference path: what every path is forced on (as in the audit)."""
    caches = s16.caches("fp16", capacity=ids.shape[1] + gen, kernel="reference")
    first = prefill(s16.lm.model, ids, caches, s16.cfg.prefill_chunk)
    return greedy_decode(s16.lm.model, first, caches, gen)[0]


def contexts(args: argparse.Namespace, s16: Session, *more: Session):
    """Per context of --contexts: (context, the audit's prompt ids, fp16's forced tokens), RoPE set on all."""
    for ctx in map(int, args.contexts.split(",")):
        for s in (s16, *more):
            fit_context(s.lm, ctx, s.cfg.yarn)
        ids = prompt_ids(s16, ctx)
        yield ctx, ids, forced_tokens(s16, ids, args.gen)


def main() -> int:
    args = parse_args(__doc__, MODES)
    gpu = torch.cuda.is_available()
    if not gpu:
        print("# no CUDA GPU: the reference paths only (a dry run)")
    modes = args.modes.split(",")
    s16 = open_session(args.model, "bfloat16", modes)
    s32 = open_session(args.model, "float32", modes)
    rows = []
    print(f"{'ctx':>6} {'mode':<17} {'variant':<14} {'KL(ref||x)':>11} {'flips':>5} {'margin':>6} {'max|d|':>7} "
          f"{'KL(ref32||x)':>12}")  # fmt: skip
    for ctx, ids, forced in contexts(args, s16, s32):
        for mode in modes:
            t0 = time.time()
            got = {}
            variants = [("ref", s16, dict(fused=False)), ("triton", s16, dict(fused=True))]
            variants.append(("nogemv", s16, dict(fused=True, gemv=False)))
            if s16.resolve(mode).effective in TURBO_V:
                variants += [("nofold", s16, dict(fused=True, fold=False))]
                variants += [("nofold-nogemv", s16, dict(fused=True, fold=False, gemv=False))]
            variants += [("ref32", s32, dict(fused=False)), ("triton32", s32, dict(fused=True))]
            variants = [v for v in variants if gpu or not v[2]["fused"]]
            for name, s, kw in variants:
                try:
                    got[name] = logits_of(s, mode, ids, forced, **kw)
                except Exception as exc:  # an experiment: record and go on
                    print(f"{ctx:>6} {mode:<17} {name:<14} failed: {type(exc).__name__}: {str(exc)[:150]}")
                    rows.append({"context": ctx, "mode": mode, "variant": name, "error": str(exc)[:300]})
            for name, x in got.items():
                row = {"context": ctx, "mode": mode, "variant": name}
                if "ref" in got and name != "ref":
                    row.update(compare(got["ref"], x))
                if "ref32" in got and name in ("ref", "triton", "triton32"):
                    row["kl_vs_ref32"] = quality.kl_divergence(got["ref32"], x)
                rows.append(row)
                if len(row) > 3:
                    print(
                        f"{ctx:>6} {mode:<17} {name:<14} {row.get('kl', float('nan')):>11.3g} "
                        f"{row.get('flips', ''):>5} {row.get('worst_margin', float('nan')):>6.3g} "
                        f"{row.get('max_diff', float('nan')):>7.3g} {row.get('kl_vs_ref32', float('nan')):>12.3g}"
                    )
            print(f"# {ctx} {mode}: {time.time() - t0:.1f} s", flush=True)
            if args.json:  # after every mode, so that a run cut short keeps what it measured
                with open(args.json, "w") as f:
                    json.dump({"gpu": torch.cuda.get_device_name() if gpu else "cpu", "rows": rows}, f, indent=1)
    return 0


def prompt_ids(s: Session, ctx: int):
    """The audit's prompt at `ctx` tokens (the bundled novel and its default question)."""
    return prompts.build_prompt(s.lm.tokenizer, ctx, question=prompts.DEFAULT_QUESTION).to(s.device)


if __name__ == "__main__":
    sys.exit(main())
