#!/usr/bin/env bash
# Twenty-sixth session: the audit's kernel check taken apart (scripts/exp/path_gap.py), then raw turbo4's
# audit again (its runs.csv did not come back on 2026-12-04). The default model comes over in thirds
# (scripts/exp/model-lib.sh says how).
source scripts/exp/model-lib.sh
mkdir -p $OUT/path-gap
timeout ${GAP_TIMEOUT:-420} python3 scripts/exp/path_gap.py --model $G --contexts ${GAP_CONTEXTS:-2048,32768} \
  --json $OUT/path-gap/path-gap.json > $OUT/path-gap/path-gap.txt 2>&1
echo "path_gap rc=$? t=$SECONDS"; grep -v "^#" $OUT/path-gap/path-gap.txt | tail -60
timeout ${RAW4_TIMEOUT:-100} python3 -m kvbench audit --model $G --modes turbo4 --no-fallback \
  --contexts 2k,8k,32k --out $OUT/audit-raw-turbo4 --quiet > $OUT/raw4.log 2>&1
echo "raw4 rc=$? t=$SECONDS"; tail -3 $OUT/raw4.log
(cd $OUT && tar czf all.tgz path-gap audit-raw-turbo4 raw4.log)
