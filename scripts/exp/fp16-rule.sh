#!/usr/bin/env bash
# Thirty-fourth session: fp16's split count rounded to the nearest whole program per SM (`nearest`) rather than
# up, end to end at batch 2, 4, 8 and 16 over 2K / 8K / 32K. On the H200 (132 SMs, 8 KV heads) that is
# 1 split at batch 16 (now 2), 2 at 8 (3), 4 at 4 (5), 8 at 2 (9); batch 1 keeps 17. The thirty-third
# session's rows grid put one split 2-6% ahead of two at batch 16 (attention + append alone), and one A/B
# pair at 2K read +1.96% end to end. Runs alternate def / near / near / def, fp16 only; then the benchmark
# of the results at this commit (`step bench`). One call, no carry, ~8 min:
#   KVBENCH_GIT_COMMIT=<sha> bash scripts/exp/fp16-rule.sh
# Predictions: batch 16 +1.5-2% at 2K, +0.5-1% at 8K, +0.2-0.4% at 32K; batch 8 (2 splits of 64 rows: 128
# programs) about as much; batch 2 and 4 within 0.3% either way.
source scripts/exp/ab-lib.sh
declare -A V=([def]='{}' [near]='{"fp16": {"nearest": true}}')
BUDGET_S=${BUDGET_S:-330} AB_TIMEOUT=${AB_TIMEOUT:-110} ab_runs "def:2k,8k,32k:2,4,8,16 near:2k,8k,32k:2,4,8,16 near:2k,8k,32k:2,4,8,16 def:2k,8k,32k:2,4,8,16" fp16
python3 - <<'P'
import csv, os, statistics
out = os.environ["OUT"]
runs = {1: "def", 2: "near", 3: "near", 4: "def"}
tok = {}
for n, v in runs.items():
    try:
        for r in csv.DictReader(open(f"{out}/r/run-{n}/bench.csv")):
            if r["decode_tok_s"]:
                tok.setdefault((int(r["batch"]), int(r["context_tokens"])), {}).setdefault(v, []).append(float(r["decode_tok_s"]))
    except FileNotFoundError:
        pass
print("batch context  def tok/s (runs 1, 4)   near tok/s (runs 2, 3)   near/def")
for (b, c), d in sorted(tok.items()):
    if "def" in d and "near" in d:
        print(f"{b:5d} {c:7d}  {' / '.join(f'{x:.2f}' for x in d['def']):>22}  {' / '.join(f'{x:.2f}' for x in d['near']):>22}"
              f"   {statistics.mean(d['near']) / statistics.mean(d['def']):.4f}")
P
(cd $OUT && tar czf fp16-rule.tgz r && rm -rf r)
