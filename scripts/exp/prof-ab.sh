#!/usr/bin/env bash
# Eleventh session, after run 1 of bf16-scales.sh: GPU time per kernel of the captured step (int8 beside
# fp16, 32K, batch 16), new tree (N) against .gpu/old (O), to find what made the step slower.
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
NEW=$PWD OLD=$PWD/.gpu/old
for v in N O; do
  s=$NEW; [ $v = O ] && s=$OLD
  (cd $s && PYTHONPATH=$s timeout 100 python3 scripts/profile_step.py --modes int8 --context 32768 --batch 16 --steps 10) > $OUT/prof-$v.txt 2>&1
  echo "prof $v rc=$? t=$SECONDS"; grep -v "idle:\|Warn\|warn" $OUT/prof-$v.txt | head -16
done
