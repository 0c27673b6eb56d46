#!/usr/bin/env bash
# Twenty-first session, after b1-shapes2.sh (call 1): variant c (64-token blocks, 4 warps, 3 stages; 33 splits
# of 4 blocks) read turbo4-asym 1.0038x of fp16 at 8K, batch 1 against 1.0000-1.0009 for the defaults
# (33 splits of 2 blocks of 128), but 1.021x against 1.033x at 32K, where each split holds 16 of its blocks
# (17% more instructions a token). One run only. This repeats it where splits are short (2K and 8K), for the
# three modes that share turbo4-asym's batch-1 shape, alternating with the defaults on one lease.
# Prediction: turbo4-asym +0.2-0.4 points at 8K in every repetition; turbo3-asym and delegated within +-0.2.
source scripts/exp/ab-lib.sh
export AB_FLAGS="--no-fallback"
M=turbo4-asym,turbo3-asym,turbo4-delegated
declare -A V=([def]='{}' [c]=$(some $M '{"block_n": 64, "num_warps": 4, "num_stages": 3}'))
RUNS=${RUNS:-"def:2k,8k:1 c:2k,8k:1 def:2k,8k:1 c:2k,8k:1 def:2k,8k:1 c:2k,8k:1"}
ab_runs "$RUNS" ${MODES:-fp16,turbo4-asym,turbo3-asym,turbo4-delegated}
(cd $OUT && tar czf b1-short.tgz r && rm -rf r)
