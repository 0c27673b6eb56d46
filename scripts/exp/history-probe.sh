#!/usr/bin/env bash
# Twenty-eighth session: bf16 greedy tokens at 32K by what the process ran before, per SDPA backend
# (scripts/exp/history_probe.py). The default model comes over in thirds (scripts/exp/model-lib.sh says how).
source scripts/exp/model-lib.sh
mkdir -p $OUT/history-probe
for sdpa in ${SDPAS:-default math efficient}; do
  for order in ${ORDERS:-32768 2048,32768 8192,32768}; do
    timeout 90 python3 scripts/exp/history_probe.py --model $G --order $order --sdpa $sdpa 2>&1 \
      | grep -v "^\[transformers\]" | tee -a $OUT/history-probe/history.txt | cut -c1-200
  done
  echo "t=$SECONDS"
done
