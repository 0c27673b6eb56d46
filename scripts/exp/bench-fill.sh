#!/usr/bin/env bash
# Thirty-seventh session, after fill-floor.sh dropped the 2/3 fill floor (084936e): the benchmark of the results
# (`scripts/h200.sh step bench`) at the new default, then the new default against plain nearest (what the fill
# floor kept there) at the batches fill-floor.sh did not time: fp16 at 10, 18, 22 and int8 at 10, 18, 22, 32K,
# alternating def old old def (fp16 at 10 and int8 at 18 and 22: 1 split against 2; the other cells agree).
# One call on an H200 (fp16 at batch 16, 32K does not fit 80 GB), no carry, ~8 min:
#   KVBENCH_GIT_COMMIT=<sha> bash scripts/exp/bench-fill.sh
# Prediction: +5-15% at the changed cells (fill-floor.sh: +3.8% to +15.9%), the rest within 0.1%.
OUT=${OUT:-/tmp/out}
if [ -z "${SKIP_BENCH:-}" ]; then  # SKIP_BENCH=1: the A/B alone (on an H100, where fp16 at 18 and 22 runs out of memory)
  BENCH_TIMEOUT=300 bash scripts/h200.sh step bench > $OUT/bench-step.log 2>&1
  echo "bench step rc=$? t=$SECONDS"; tail -4 $OUT/bench-step.log
fi
source scripts/exp/ab-lib.sh
declare -A V=([def]='{}' [old]='{"fp16": {"nearest": true}, "int8": {"nearest": true}}')
BUDGET_S=${BUDGET_S:-470} AB_TIMEOUT=${AB_TIMEOUT:-90} ab_runs "def:32k:10,18,22 old:32k:10,18,22 old:32k:10,18,22 def:32k:10,18,22" fp16,int8
(cd $OUT && tar czf fill-more.tgz r && rm -rf r)
