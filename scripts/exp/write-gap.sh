#!/usr/bin/env bash
# Twenty-seventh session: the float32 gap between the kernel check's paths taken apart by the writes
# (scripts/exp/write_gap.py). The default model comes over in thirds
# (scripts/exp/model-lib.sh says how).
source scripts/exp/model-lib.sh
mkdir -p $OUT/write-gap
timeout ${GAP_TIMEOUT:-500} python3 scripts/exp/write_gap.py --model $G --contexts ${GAP_CONTEXTS:-2048,32768} \
  --json $OUT/write-gap/write-gap.json > $OUT/write-gap/write-gap.txt 2>&1
echo "write_gap rc=$? t=$SECONDS"; tail -50 $OUT/write-gap/write-gap.txt
