#!/usr/bin/env bash
# Nineteenth session: at 8K, batch 1, the `dot_fence` defaults (def) against turbo3-asym with the fence (t3f)
# and turbo4-asym without it (a4off), three times each in turn on one lease: the two choices that lost or
# gained least in scripts/exp/dot-fence.sh, measured again around the defaults.
source scripts/exp/ab-lib.sh
export AB_FLAGS="--no-fallback"
declare -A V=([def]='{}' [t3f]=$(some turbo3-asym '{"dot_fence": true}') [a4off]=$(some turbo4-asym '{"dot_fence": false}'))
ab_runs "def:8k:1 t3f:8k:1 a4off:8k:1 def:8k:1 t3f:8k:1 a4off:8k:1 def:8k:1 t3f:8k:1 a4off:8k:1" fp16,turbo4-asym,turbo3-asym,turbo4-delegated
(cd $OUT && tar czf b1.tgz r && rm -rf r)
