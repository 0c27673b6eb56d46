#!/usr/bin/env bash
# EXPERIMENT (timing only): the turbo reductions without their transforms or their write, at batch 1.
# Ran on the working tree of 36174fd with results/2026-12-01h-h200/experiments/fold-upper-bound/toggles.patch
# applied (the KVBENCH_EXP switches it adds are not in the committed kernels); results in that folder.
set -u
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
B="--model dummy:llama-3.1-8b --modes fp16,turbo4-asym,turbo3-asym,turbo4-delegated --contexts 8k,32k --batch 1 --warmup 8 --gen 64 --repeats 3 --quiet --devices 0"
for v in 0 1 3 7 8 0 7 8; do
  KVBENCH_EXP=$v timeout 100 python3 -m kvbench decode-bench $B --out $OUT/e$v-$SECONDS > $OUT/e$v-$SECONDS.log 2>&1; echo "exp $v rc=$? t=$SECONDS"
done
python3 - <<'P'
import csv, glob, os, collections
out = os.environ["OUT"]
for d in sorted(glob.glob(out + "/e*/bench.csv"), key=lambda p: int(p.split("-")[-1].split("/")[0])):
    rows = list(csv.DictReader(open(d)))
    base = {(r["context_tokens"],): float(r["decode_tok_s"]) for r in rows if r["kv_cache_mode"] == "fp16" and r["decode_tok_s"]}
    line = []
    for r in rows:
        if r["decode_tok_s"]:
            line.append(f'{r["kv_cache_mode"]}@{r["context_tokens"]}={float(r["decode_tok_s"]):.1f}({float(r["decode_tok_s"])/base[(r["context_tokens"],)]:.3f})')
    print(d.split("/")[-2], " ".join(line))
P
