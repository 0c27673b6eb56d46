#!/usr/bin/env bash
# Thirty-fourth session, after fp16-rule.sh: split counts rounded down ("down": the grid never passes the lower
# bound of programs an SM) against the defaults, for fp16 (one program an SM, 132 slots on an H200 / H100 SXM)
# and int8 (two an SM, 264), at the batches where the two roundings differ (8 KV heads):
#   batch 2: int8 17 -> 16 splits (272 -> 256 programs);   batch 3: fp16 6 -> 5 (144 -> 120)
#   batch 5: int8 7 -> 6 (280 -> 240);                     batch 6: fp16 3 -> 2 (144 -> 96), int8 6 -> 5 (288 -> 240)
# Alternating default / down / down / default, 8K and 32K, fp16 and int8 in every run. One call, no carry, ~5 min:
#   KVBENCH_GIT_COMMIT=<sha> bash scripts/exp/split-down.sh
# Prediction: at 32K +3-8% where a sliver is cut (fp16's cost it 9-16% at batch 2-8), at 8K +1-4%; fp16 at
# batch 6 may lose (96 programs leave 36 SMs idle against a sliver of 12).
# Ran on an H100 at 762c11f (results/2026-12-05c-gpu/split-down); from it the default became SLIVER (1/20).
# VS=old: the default against the rule before it (plain nearest), e.g. C=8k,32k B=3,5,6 VS=old.
source scripts/exp/ab-lib.sh
declare -A V=([def]='{}' [down]='{"fp16": {"nearest": "down"}, "int8": {"nearest": "down"}}'
  [old]='{"fp16": {"nearest": true}, "int8": {"nearest": true}}')
C=${C:-8k,32k} B=${B:-2,3,5,6} VS=${VS:-down}  # C=32k: the half that matters most, when GPU time is short
export VS
BUDGET_S=${BUDGET_S:-330} AB_TIMEOUT=${AB_TIMEOUT:-150} ab_runs "def:$C:$B $VS:$C:$B $VS:$C:$B def:$C:$B" fp16,int8
python3 - <<'P'
import csv, os, statistics
out, vs = os.environ["OUT"], os.environ["VS"]
tok = {}
for n, v in {1: "def", 2: vs, 3: vs, 4: "def"}.items():
    try:
        for r in csv.DictReader(open(f"{out}/r/run-{n}/bench.csv")):
            if r["decode_tok_s"]:
                k = (r["kv_cache_mode"], int(r["batch"]), int(r["context_tokens"]))
                tok.setdefault(k, {}).setdefault(v, []).append(float(r["decode_tok_s"]))
    except FileNotFoundError:
        pass
print(f"mode  batch context   def tok/s (runs 1, 4)   {vs:>4} tok/s (runs 2, 3)   {vs}/def")
for (m, b, c), d in sorted(tok.items()):
    if "def" in d and vs in d:
        print(f"{m:5s} {b:5d} {c:7d}  {' / '.join(f'{x:.2f}' for x in d['def']):>22}  "
              f"{' / '.join(f'{x:.2f}' for x in d[vs]):>22}   {statistics.mean(d[vs]) / statistics.mean(d['def']):.4f}")
P
(cd $OUT && tar czf split-$VS.tgz r && rm -rf r)
