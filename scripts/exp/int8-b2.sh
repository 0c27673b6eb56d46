#!/usr/bin/env bash
# Thirty-fourth session, after fp16-rule.sh: int8's split kernel holds two programs an SM, and at batch 2 its
# split count (17, rounded to the nearest 2 programs per SM) gives 17 x 16 = 272 programs for 264 slots on an
# H200: a full wave and a sliver of 8. 16 splits (256 programs) make one wave. Alternating default / 16 / 16 /
# default at batch 2, 2K / 8K / 32K, fp16 beside int8. One call, no carry, ~2-3 min:
#   KVBENCH_GIT_COMMIT=<sha> bash scripts/exp/int8-b2.sh
# Prediction: +3-8% for int8 at 32K (fp16's sliver of 12 programs cost it 12.7% there, but int8's programs are
# half as long per SM-slot), +0-2% at 2K and 8K.
source scripts/exp/ab-lib.sh
declare -A V=([def]='{}' [s16]='{"int8": {"splits": 16}}')
BUDGET_S=${BUDGET_S:-300} ab_runs "def:2k,8k,32k:2 s16:2k,8k,32k:2 s16:2k,8k,32k:2 def:2k,8k,32k:2" fp16,int8
(cd $OUT && tar czf int8-b2.tgz r && rm -rf r)
