#!/usr/bin/env bash
# Twenty-seventh session: `wave` (choose_num_splits counts waves of the one-warp long shape's programs, 8 an SM)
# against the defaults of then (no `wave`), alternating on one lease, dummy Llama-3.1-8B, --no-fallback. Where its
# first version (ties to the fewer splits) changed the split count (long shape, 132 SMs): 32K batch 4 and 8
# (65 -> 33), batch 32 (17 -> 8), 47 (12 -> 11), 64 (9 -> 4), 87 (7 -> 3); batch 1, 2, 16 and every 16K batch up to
# 16 keep theirs. `wave` is the default now: the `def` variant below reproduces these runs only with
# '{"turbo3-asym": {"wave": 0}, "turbo4": {"wave": 0}}', and the final rule gives batch 32 16, 64 8, 87 6.
# PART=a: 32K, batch 4 and 8, with fp16 (ratios). PART=b: 32K, batch 32, 47 and 87 (turbo4 alone at 87).
# PART=c: batch 1 and the largest batch that fits at 32K (--capacity), turbo3-asym and turbo4.
# Prediction: batch 8 +0.6-1.8 points (the twenty-fourth session's 33 against 65); batch 4 within +-1;
# the large batches within +-3 (the model of waves x tokens per split says 2-7% less attention time).
source scripts/exp/ab-lib.sh
export AB_FLAGS="--no-fallback"
W='{"wave": 8}'
declare -A V=([def]='{}' [wave]="{\"turbo3-asym\": $W, \"turbo4\": $W}")
if [ "${PART:-a}" = a ]; then
  BUDGET_S=${BUDGET_S:-500} ab_runs "def:32k:8 wave:32k:8 def:32k:4 wave:32k:4 wave:32k:8 def:32k:8 wave:32k:4 def:32k:4" \
    fp16,turbo3-asym,turbo4
elif [ "${PART}" = b ]; then  # (batch 87 ran out of memory after fp16's cell, which decode-bench adds: no reading)
  BUDGET_S=${BUDGET_S:-330} ab_runs "def:32k:32 wave:32k:32 wave:32k:47 def:32k:47" turbo3-asym,turbo4
  RUN0=4 BUDGET_S=${BUDGET_S2:-500} ab_runs "def:32k:87 wave:32k:87 wave:32k:87 def:32k:87" turbo4
else  # PART=c: the largest batch at 32K as the benchmark finds it (--capacity), per mode
  export AB_FLAGS="--no-fallback --capacity" AB_TIMEOUT=${AB_TIMEOUT:-170}
  BUDGET_S=${BUDGET_S:-420} ab_runs "def:32k:1 wave:32k:1 wave:32k:1 def:32k:1" turbo3-asym,turbo4
fi
(cd $OUT && tar czf wave-splits-${PART:-a}.tgz r && rm -rf r)
