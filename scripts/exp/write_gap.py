"""Where does the float32 gap between the kernel check's paths come from? (twenty-seventh session)

`path_gap.py` (twenty-sixth session) found that in float32 the reference and fused paths nearly meet for fp16
and delegated (KL ~1e-8) but not for int8 (2e-4 / 7e-4 at 2K / 32K), turbo4-asym, turbo3-asym and raw turbo4.
The guess left in the kernel notes: the Triton quantize-on-write (prefill and decode appends) puts a few
coordinates that sit on a code boundary into the neighbouring cell, and the model amplifies that.

Per context and mode, all in float32 on the default model, teacher-forced on fp16's greedy tokens:
  ref        reference path: caches written by PyTorch (`kernel="reference"`), reference decode
  triton     fused path: the prefill written by the Triton quantize-on-write, Triton decode and appends
  tri-refpf  fused path whose prefill was written by PyTorch (the cache's `use_triton` off while it fills)
  ref-triw   reference decode (PyTorch attention) over caches that the Triton quantize-on-write fills, in the
             prefill and at every appended token: the writes alone
Printed: KL(ref || x) and argmax flips for each of the other three; and the stored cache compared with the
reference's after the prefill and after the last forced token: how many K / V coordinates differ, and the
largest difference over the row's largest |value| (one int8 code step is 1/127 = 0.0079 of it).

Usage (GPU): python scripts/exp/write_gap.py --model M.gguf --contexts 2048,32768 --json out.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from path_gap import contexts, open_session, parse_args

from kvbench import quality
from kvbench.engine.generate import make_stepper, prefill, teacher_forced

MODES = "fp16,int8,turbo4-asym,turbo3-asym,turbo4-delegated,turbo4"


def stored(caches) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every layer's live K, V as the mode stores them, dequantized (float32, on the device)."""
    return [tuple(x.float().clone() for x in c.dequantized()) for c in caches]


def run(s, mode: str, ids, forced, variant: str):
    eff = s.resolve(mode).effective
    kernel = "reference" if variant == "ref" else "triton"
    caches = s.caches(eff, capacity=ids.shape[1] + forced.shape[1], kernel=kernel)
    if variant == "tri-refpf":
        for c in caches:
            c.use_triton = lambda: False  # the prefill's appends through PyTorch's quantizer
    first = prefill(s.lm.model, ids, caches, s.cfg.prefill_chunk)
    for c in caches:
        c.__dict__.pop("use_triton", None)
    after_prefill = stored(caches)
    step = make_stepper(s.lm.model, caches, fused=variant in ("triton", "tri-refpf") and torch.cuda.is_available())
    logits = teacher_forced(s.lm.model, first, caches, forced, step=step)[0].float().cpu()
    after_decode = stored(caches)
    del caches, step
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return logits, after_prefill, after_decode


POSITIONS = (0, 1, 2, 4, 8, 16, 32, 63)


def kl_at(ref_logits, logits, i: int) -> float:
    return quality.kl_divergence(ref_logits[i : i + 1], logits[i : i + 1])


def cache_diff(a, b) -> dict:
    """Coordinates of K and V that differ between two stored caches, and the largest difference."""
    out = {}
    for side, i in (("k", 0), ("v", 1)):
        diff = total = 0
        worst = 0.0
        for la, lb in zip(a, b, strict=True):
            x, y = la[i], lb[i]
            if x.shape != y.shape:
                out[f"{side}_shape"] = f"{tuple(x.shape)} vs {tuple(y.shape)}"
                break
            d = (x - y).abs()
            total += d.numel()
            diff += int((d > 0).sum())
            row = x.abs().amax(-1, keepdim=True).clamp_min(1e-30)
            worst = max(worst, float((d / row).max()))
        out[f"{side}_differ"] = diff
        out[f"{side}_frac"] = diff / max(1, total)
        out[f"{side}_max_rel"] = worst  # largest |difference| / the row's largest |value|
    return out


def main() -> int:
    args = parse_args(__doc__, MODES)
    gpu = torch.cuda.is_available()
    if not gpu:
        print("# no CUDA GPU: every variant runs the reference path (a dry run of this script)")
    modes = args.modes.split(",")
    s16 = open_session(args.model, "bfloat16", ["fp16"])
    s32 = open_session(args.model, "float32", modes)
    rows = []
    for ctx, ids, forced in contexts(args, s16, s32):
        for mode in modes:
            t0 = time.time()
            got = {v: run(s32, mode, ids, forced, v) for v in ("ref", "triton", "tri-refpf", "ref-triw")}
            ref_logits, ref_pf, ref_end = got["ref"]
            for v in ("triton", "tri-refpf", "ref-triw"):
                logits, pf, end = got[v]
                agree = quality.path_agreement(ref_logits, logits, 0.5)
                row = {"context": ctx, "mode": mode, "variant": v, "kl": agree.kl, "flips": agree.flips,
                       "max_logit_diff": float((ref_logits - logits).abs().max())}  # fmt: skip
                # KL at chosen positions: 0 is the prefill's last logits, 1 the first decode step (its cache
                # the prefill's; its fresh token used exactly, so only the attention's arithmetic differs)
                row["kl_at"] = {i: kl_at(ref_logits, logits, i) for i in POSITIONS if i < len(logits)}
                row.update({f"prefill_{k}": x for k, x in cache_diff(ref_pf, pf).items()})
                row.update({f"end_{k}": x for k, x in cache_diff(ref_end, end).items()})
                rows.append(row)
                print(
                    f"{ctx:>6} {mode:<17} {v:<10} KL {row['kl']:.3g} flips {row['flips']} "
                    f"max|dlogit| {row['max_logit_diff']:.3g} | prefill K {row['prefill_k_differ']} "
                    f"({row['prefill_k_frac']:.2e}, {row['prefill_k_max_rel']:.3g}) V {row['prefill_v_differ']} "
                    f"({row['prefill_v_frac']:.2e}, {row['prefill_v_max_rel']:.3g}) | end K {row['end_k_differ']} "
                    f"({row['end_k_max_rel']:.3g}) V {row['end_v_differ']} ({row['end_v_max_rel']:.3g})",
                    flush=True,
                )
                print(f"{'':>6} {'':<17} {v:<10} KL at positions " + " ".join(
                    f"{i}:{x:.2g}" for i, x in row["kl_at"].items()), flush=True)  # fmt: skip
            print(f"# {ctx} {mode}: {time.time() - t0:.1f} s", flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump({"gpu": torch.cuda.get_device_name() if gpu else "cpu", "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
