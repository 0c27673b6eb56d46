#!/usr/bin/env bash
# Thirty-seventh session: the cases the thirty-sixth left unmeasured (results/2026-12-05c-gpu/fill), at 32K:
#   the fill floor (`c8128b4`): where rounding down would fill 2/3 of the slots or less, the default keeps the sliver:
#     fp16 batch 9 / 11: 2 splits (144 / 176 programs past 132 slots); "down" takes 1 (72 / 88: 55% / 67% full)
#     int8 batch 20: 2 splits (320 past 264); "down" takes 1 (160: 61% full)
#   SLIVER's own cut, not run before: int8 batch 13: 2 splits (208, 79% full); "old" (plain nearest) takes 3 (312)
#   and int8 batch 9 (3 against old's 4) again, the thirty-sixth's +12.9% read once on an H100
# Variants def / down / old, alternating def down old old down def, fp16 and int8 at batch 9, 11, 13, 20.
# One call, no carry, ~6 min:  KVBENCH_GIT_COMMIT=<sha> bash scripts/exp/fill-floor.sh
# Prediction: down loses 5-20% at the fill-floor cells (a third or more of the SMs idle against a 9-21% sliver);
# int8 batch 13 gains 8-15% over old (like batch 12's +15.9%); the cells whose counts agree move under 0.1%.
source scripts/exp/ab-lib.sh
declare -A V=([def]='{}' [down]='{"fp16": {"nearest": "down"}, "int8": {"nearest": "down"}}'
  [old]='{"fp16": {"nearest": true}, "int8": {"nearest": true}}')
C=${C:-32k} B=${B:-9,11,13,20}
BUDGET_S=${BUDGET_S:-480} AB_TIMEOUT=${AB_TIMEOUT:-100} \
  ab_runs "def:$C:$B down:$C:$B old:$C:$B old:$C:$B down:$C:$B def:$C:$B" fp16,int8
python3 - <<'P'
import csv, os, statistics
out = os.environ["OUT"]
tok = {}
for n, v in {1: "def", 2: "down", 3: "old", 4: "old", 5: "down", 6: "def"}.items():
    try:
        for r in csv.DictReader(open(f"{out}/r/run-{n}/bench.csv")):
            if r["decode_tok_s"]:
                k = (r["kv_cache_mode"], int(r["batch"]), int(r["context_tokens"]))
                tok.setdefault(k, {}).setdefault(v, []).append(float(r["decode_tok_s"]))
    except FileNotFoundError:
        pass
print("mode  batch context   def tok/s (runs 1, 6)  down tok/s (runs 2, 5)   old tok/s (runs 3, 4)  down/def  old/def")
for (m, b, c), d in sorted(tok.items()):
    cols = [" / ".join(f"{x:.2f}" for x in d.get(v, [])) for v in ("def", "down", "old")]
    ratios = [f"{statistics.mean(d[v]) / statistics.mean(d['def']):.4f}" if v in d and "def" in d else "-"
              for v in ("down", "old")]
    print(f"{m:5s} {b:5d} {c:7d}  {cols[0]:>22}  {cols[1]:>22}  {cols[2]:>22}  {ratios[0]:>8} {ratios[1]:>8}")
P
(cd $OUT && tar czf fill-floor.tgz r && rm -rf r)
