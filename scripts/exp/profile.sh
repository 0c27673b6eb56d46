#!/usr/bin/env bash
# GPU time per kernel inside the captured decode step (scripts/profile_step.py), where the targets still miss.
# Ran on the working tree of 36174fd plus the reduction signs loaded before the wait; results in
# results/2026-12-01h-h200/experiments/profile-before/ (phase AU of scripts/h200.sh repeats it at e688281).
set -u
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
P="timeout 150 python3 scripts/profile_step.py --steps 20 --no-fallback"
$P --modes fp16,int8,turbo4-asym,turbo3-asym,turbo4-delegated --context 8192 --batch 1 > $OUT/prof-8k-b1.txt 2>&1; echo "8k b1 rc=$? t=$SECONDS"
$P --modes fp16,int8,turbo4,turbo4-delegated --context 32768 --batch 1 > $OUT/prof-32k-b1.txt 2>&1; echo "32k b1 rc=$? t=$SECONDS"
$P --modes fp16,int8,turbo4 --context 32768 --batch 16 --steps 10 > $OUT/prof-32k-b16.txt 2>&1; echo "32k b16 rc=$? t=$SECONDS"
cat $OUT/prof-*.txt
