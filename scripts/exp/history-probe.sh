#!/usr/bin/env bash
# Twenty-eighth session: bf16 greedy tokens at 32K by what the process ran before, per SDPA backend
# (scripts/exp/history_probe.py). Needs the default model joined into /tmp/kvbench-model (model-lib.sh).
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=/tmp/site:$PWD
G=/tmp/kvbench-model/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p $OUT/history-probe
for sdpa in ${SDPAS:-default math efficient}; do
  for order in ${ORDERS:-32768 2048,32768 8192,32768}; do
    timeout 90 python3 scripts/exp/history_probe.py --model $G --order $order --sdpa $sdpa 2>&1 \
      | grep -v "^\[transformers\]" | tee -a $OUT/history-probe/history.txt | cut -c1-200
  done
  echo "t=$SECONDS"
done
