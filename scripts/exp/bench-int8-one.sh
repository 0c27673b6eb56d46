#!/usr/bin/env bash
# Thirty-eighth session (no GPU lent; written for the next): the benchmark of the results (`scripts/h200.sh step
# bench`) at the split default of 084936e (SLIVER without the fill floor), then one question the fill floor's runs
# raise: int8 at batch 16 on one split a row (128 programs: one an SM, 4 SMs idle) against its default two (256
# of 264 slots). fill-floor.sh and bench-fill.sh found one long split beating two in every cell tried on an H100
# (fp16 at batch 9-11 +3.8% to +15.9%, int8 at 18-22 +9.9% to +14.1%, 32K), but each of those two-split grids
# passed the slots (a sliver wave); at batch 16 int8's does not, and "2 splits beat 3 or 5" (2026-11-30 sweep)
# never timed 1. Alternating def one one def, fp16 and int8 at batch 16, 8K and 32K.
# One call on an H200 (fp16 at batch 16, 32K does not fit 80 GB), no carry, ~7 min:
#   KVBENCH_GIT_COMMIT=<sha> bash scripts/exp/bench-int8-one.sh      (SKIP_BENCH=1: the A/B alone)
# Prediction: within +-3% at 32K (one program an SM streams as fast as two only where int8's unpacking hides
# behind the loads; batch 18's one split ran 144 programs, 12 SMs with two); at 8K (8 blocks a split) slower,
# by 2-8%: the pipeline fills and drains once per split with nothing on the SM to overlap it.
OUT=${OUT:-/tmp/out}
if [ -z "${SKIP_BENCH:-}" ]; then
  BENCH_TIMEOUT=300 bash scripts/h200.sh step bench > $OUT/bench-step.log 2>&1
  echo "bench step rc=$? t=$SECONDS"; tail -4 $OUT/bench-step.log
fi
source scripts/exp/ab-lib.sh
declare -A V=([def]='{}' [one]='{"int8": {"splits": 1}}')
BUDGET_S=${BUDGET_S:-480} AB_TIMEOUT=${AB_TIMEOUT:-100} \
  ab_runs "def:8k,32k:16 one:8k,32k:16 one:8k,32k:16 def:8k,32k:16" fp16,int8
python3 scripts/exp/ab_summary.py $OUT/r def,one,one,def | tee $OUT/summary.txt
(cd $OUT && tar czf int8-one.tgz r && rm -rf r)
