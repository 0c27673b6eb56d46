#!/usr/bin/env bash
# Twenty-fourth session, call 3, at the commit where turbo3-asym takes the one-warp long shape and turbo4's long
# shape keeps splits of >= 512 tokens (`split_tokens`). 1. the long shape's GPU tests (compiled kernels, bf16,
# Llama-3.1-8B's heads at 20,001 tokens); 2. in turn, the defaults (`def`) against `alt`: turbo3-asym with
# 512-token splits, turbo4 with 1024 (its previous floor), at 16K batch 16 and at batch 8 (16K, 32K: the batch
# where the two floors differ most for both modes).
# Prediction: turbo3-asym +1-3 points at 16K, batch 16 (33 splits instead of 17, as turbo4 gained 4.4);
# batch 8 within +-1.5 for both.
source scripts/exp/ab-lib.sh
TESTS=${TESTS:-"long_shape or (L20001 and (turbo3 or turbo4))"}
BUDGET_S=${BUDGET_S:-200} ab_tests tests/test_kernels.py
export AB_FLAGS="--no-fallback"
declare -A V=([def]='{}' [alt]='{"turbo3-asym": {"split_tokens": 512}, "turbo4": {"split_tokens": 1024}}')
BUDGET_S=${BUDGET_S:-470} ab_runs "def:16k:16 alt:16k:16 def:32k:8 alt:32k:8 def:16k:8 alt:16k:8 alt:16k:16 def:16k:16" \
  fp16,turbo3-asym,turbo4
(cd $OUT && tar czf long-shapes3.tgz r && rm -rf r)
