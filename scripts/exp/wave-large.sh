#!/usr/bin/env bash
# Twenty-seventh session, call 11: raw turbo4 at 32K, batch 64 and 87 (where `wave` takes 9 -> 4 and 7 -> 3
# splits), timed without fp16 beside it (scripts/exp/time_cells.py), `wave` (now the default) and the old count
# (`wave` 0) alternating.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
mkdir -p $OUT/wave-large
timeout ${T:-400} python3 scripts/exp/time_cells.py --mode turbo4 --context 32768 --batches 64,87 \
  --variant old='{"turbo4": {"wave": 0}}' --variant wave='{}' --order old,wave,wave,old \
  > $OUT/wave-large/time-cells.txt 2>&1
echo "rc=$? t=$SECONDS"; cat $OUT/wave-large/time-cells.txt
