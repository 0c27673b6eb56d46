#!/usr/bin/env bash
# Eighteenth session: the prmt lookup's 8 table words, loaded once per program, sit in uniform registers; a
# byte permute reads its data words from vector registers only, and ptxas (triton 3.6) copies them at every
# use in turbo4's split kernel: 732 IMAD of its loop's 1899 instructions (64-token blocks, 2 warps, sm_90).
# `lut_regs` makes them per-thread values (`_per_thread`): 1665 instructions, IMAD 498. turbo4-asym,
# turbo3-asym and delegated compile to the same loops either way.
# Prediction: turbo4's attention 5-10% faster at batch 16 (issue-bound), less at batch 1; ratio to fp16 up
# ~1-2 points at 32K, batch 16, ~0.5-1 at batch 1; fp16 and the other modes unchanged.
# Variants: regs (per-thread words), uniform (as before). Then `w8`: turbo4-asym, turbo3-asym and delegated
# on 8 warps (2 programs of 8 warps an SM fit at 128 registers) at 8K, batch 1, beside the defaults.
# RUNS / W8_RUNS: variant:contexts:batch, in order on one lease. TESTS: run first on compiled kernels.
source scripts/exp/ab-lib.sh  # set -u, the environment, $OUT/r, the GPU's name; ab_* and some()
export AB_FLAGS="--no-fallback"
CODED=turbo4,turbo4-asym,turbo3-asym,turbo4-delegated
declare -A V=([regs]=$(some $CODED '{"lut_regs": true}') [uniform]=$(some $CODED '{"lut_regs": false}') \
  [def]='{}' [w8]=$(some turbo4-asym,turbo3-asym,turbo4-delegated '{"num_warps": 8}'))
ab_tests tests/test_kernels.py
RUNS=${RUNS:-"regs:8k,32k:1 uniform:8k,32k:1 regs:8k,32k:1 uniform:8k,32k:1 regs:32k:16 uniform:32k:16"}
ab_runs "$RUNS" ${MODES:-fp16,turbo4}
RUN0=$(echo $RUNS | wc -w) ab_runs "${W8_RUNS:-w8:8k:1 def:8k:1 w8:8k:1}" fp16,turbo4-asym,turbo3-asym,turbo4-delegated
(cd $OUT && tar czf lut-regs.tgz r && rm -rf r)
