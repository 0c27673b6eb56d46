#!/usr/bin/env bash
# Twenty-second session, after turbo3-words-b1.sh (call 3): with its new words turbo3-asym's loop is 965
# instructions a 128-token block (567 a 64-token block; turbo4-asym's: 1027 / 604), but at 8K, batch 1 it
# still reads 0.998-0.999 of fp16. In the twenty-first session turbo4-asym's short split (64-token blocks on 3
# stages where a split holds two 128-token blocks) did not move turbo3-asym (its loop was then 1296 / ~700).
# Variants, in turn on one lease: `def` (this tree's defaults), `ss` (the short split), `t4` (the short split
# and turbo4-asym's eager rescale, tau 0).
# Prediction: `ss` +0.2-0.4 points over `def` in every repetition, as it gave turbo4-asym; `t4` within
# +-0.1 of `ss` (two blocks a split: the lazy rescale skips at most one rescale).
source scripts/exp/ab-lib.sh
export AB_FLAGS="--no-fallback"
declare -A V=([def]='{}' [ss]=$(some turbo3-asym '{"short_split": [64, 3]}')
  [t4]=$(some turbo3-asym '{"short_split": [64, 3], "rescale_tau": 0.0}'))
RUNS=${RUNS:-"def:8k:1 ss:8k:1 t4:8k:1 def:8k:1 ss:8k:1 t4:8k:1 def:8k:1 ss:8k:1 t4:8k:1"}
ab_runs "$RUNS" ${MODES:-fp16,turbo3-asym}
(cd $OUT && tar czf turbo3-short.tgz r && rm -rf r)
