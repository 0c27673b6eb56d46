#!/usr/bin/env bash
# Twenty-fourth session, call 2. After call 1 (turbo3-w1-next.sh: turbo3-asym's one-warp shape wins at 16K
# and 32K, loses at 8K, batch 16), the rest of the capacity-based long shape's questions:
# 1. turbo3-asym at 16K, batch 1 and 4 (def / w1);
# 2. turbo4-asym and delegated at 32K, batch 1 and 4 on the same one-warp shape (they lost at batch 16 alone);
# 3. raw turbo4's 1024-token split floor at 512 (50 splits at 32K, batch 16; +0.9 points in the 23rd session)
#    at 16K and 32K, batch 16.
# Prediction: 1. +0.5-1 point at batch 1, +3-5 at batch 4; 2. within +-1 at batch 1, unknown at 4; 3. +0.5-1
# at 32K and 16K.
source scripts/exp/ab-lib.sh
W1='{"block_n": 32, "num_warps": 1, "num_stages": 2, "deep_stages": null, "programs_per_sm": [8, 32]}'
export AB_FLAGS="--no-fallback"
declare -A V=([def]='{}' [w1]=$(some turbo3-asym,turbo4-asym,turbo4-delegated "$W1") \
  [s512]=$(some turbo4 '{"split_tokens": 512}'))
BUDGET_S=${BUDGET_S:-470}
ab_runs "def:16k:1 w1:16k:1 def:16k:4 w1:16k:4" fp16,turbo3-asym
RUN0=4 ab_runs "def:32k:1 w1:32k:1 def:32k:4 w1:32k:4" fp16,turbo4-asym,turbo4-delegated
RUN0=8 ab_runs "def:32k:16 s512:32k:16 def:16k:16 s512:16k:16 s512:32k:16 def:32k:16" fp16,turbo4
(cd $OUT && tar czf long-shapes2.tgz r && rm -rf r)
