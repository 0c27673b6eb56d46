"""Is the float32 decode at 32K the same run to run? (twenty-eighth session)

The twenty-seventh session ran `write_gap.py` on two machine starts: at 2K every number repeated, at 32K the
KLs moved by up to 31% (int8's fused path 6.53e-4 on one start, 6.91e-4 on the other), the reference decode's
included. This probe separates "differs between runs" from "differs between machines": in one process it takes
fp16's greedy tokens (bf16, reference path, as the audit does), then runs one mode's reference and fused paths
in float32 `--repeats` times, and prints a digest of every result (the forced tokens, the logits, the stored
caches after the prefill and after the last token) with the KL between the paths, which `write_gap.py` printed
for the same cells. It also prints what identifies the machine (GPU UUID and serial, SM count, clocks, library
versions, float32 matmul settings). Run it twice on one machine start, and on another, and compare the lines.

Usage (GPU): python scripts/exp/repro_probe.py --model M.gguf --contexts 32768 --modes int8 --json out.json
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from path_gap import contexts, digest, open_session, parse_args
from write_gap import run

from kvbench import quality


def cache_digest(layers) -> str:
    return digest(*(x for kv in layers for x in kv))


def machine() -> dict:
    out = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        out.update(name=p.name, sms=p.multi_processor_count, memory=p.total_memory, uuid=str(getattr(p, "uuid", "")))
        out["l2"] = getattr(p, "L2_cache_size", None)
        out["blas"] = str(torch.backends.cuda.preferred_blas_library())
        q = "uuid,serial,pci.bus_id,vbios_version,clocks.max.sm,clocks.sm,clocks.mem,power.limit,ecc.mode.current"
        try:
            out["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            out["nvidia_smi"] = f"failed: {exc}"
    return out


def main() -> int:
    args = parse_args(__doc__, "int8", extra=[("--dtypes", "float32"), ("--repeats", "2")])
    repeats = int(args.repeats)
    gpu = torch.cuda.is_available()
    info = machine()
    for k, v in info.items():
        print(f"# {k}: {v}", flush=True)
    modes = args.modes.split(",")
    s16 = open_session(args.model, "bfloat16", ["fp16"])
    sessions = {dt: open_session(args.model, dt, modes) for dt in args.dtypes.split(",")}
    rows = []
    for ctx, ids, forced in contexts(args, s16, *sessions.values()):
        print(f"{ctx:>6} forced tokens {digest(forced)} {forced.flatten()[:8].tolist()}", flush=True)
        rows.append({"context": ctx, "forced": digest(forced)})
        for (dt, s), mode, r in itertools.product(sessions.items(), modes, range(repeats)):
            got = {}
            for v in ("ref", "triton") if gpu else ("ref",):
                logits, pf, end = run(s, mode, ids, forced, v)
                got[v] = logits
                row = {"context": ctx, "dtype": dt, "mode": mode, "repeat": r, "variant": v}
                # position 0 is the prefill's last logits: there only the prefill has run
                row.update(pos0=digest(logits[:1]), logits=digest(logits), prefill=cache_digest(pf))
                row["end"] = cache_digest(end)
                rows.append(row)
                print(f"{ctx:>6} {dt:<8} {mode:<17} run {r} {v:<7} pos0 {row['pos0']} logits {row['logits']} "
                      f"prefill {row['prefill']} end {row['end']}", flush=True)  # fmt: skip
            if "triton" in got:
                kl = quality.path_agreement(got["ref"], got["triton"], 0.5).kl
                rows.append({"context": ctx, "dtype": dt, "mode": mode, "repeat": r, "kl_ref_triton": kl})
                print(f"{ctx:>6} {dt:<8} {mode:<17} run {r} KL(ref || triton) {kl:.6g}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
