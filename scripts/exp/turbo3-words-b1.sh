#!/usr/bin/env bash
# Twenty-second session, after turbo3-words.sh (call 2): the new words made turbo3-asym faster at 32K (batch 1:
# 1.0152-1.0155 -> 1.0313-1.0314 of fp16; batch 16: 1.0896 -> 1.1616) but slower at 8K, batch 1 (1.0002 /
# 1.0002 / 1.0005 -> 0.9992 / 0.9990 / 0.9990), where a split is two blocks. Which part costs there: the
# layout ([set, token] words, 16-byte stores) or the spread? `tm` is the new spread on the old layout
# (`v3_set_major` off: 16-bit stores). And where in the layer: per-program stamps (tail_stamps.py) of each.
# Prediction: `tm` between old and new at 8K (the layout's stores are what the short split waits on);
# the stamps show new's split programs ending later than old's despite the shorter loop.
source scripts/exp/ab-lib.sh
export AB_FLAGS="--no-fallback"
declare -A V=([old]='{}' [new]='{}' [tm]=$(some turbo3-asym '{"v3_set_major": false}'))
stamps() {  # stamps VARIANT
  [ $SECONDS -gt ${BUDGET_S:-520} ] && { echo "stamps $1 skipped: time"; return 0; }
  echo "== stamps $1"
  local dir=$PWD; [ $1 = old ] && dir=$PWD/.gpu/old
  (cd $dir && KVBENCH_ATTN_CONFIG="${V[$1]}" PYTHONPATH=$dir timeout 120 python3 scripts/exp/tail_stamps.py \
    --modes fp16,turbo3-asym --context 8192 --batch 1 > $OUT/r/stamps-$1.txt 2>&1)
  echo "rc=$? t=$SECONDS"; grep -v "^#" $OUT/r/stamps-$1.txt | cut -c1-220
}
for v in old new tm; do stamps $v; done
RUNS=${RUNS:-"old:8k:1 new:8k:1 tm:8k:1 old:8k:1 new:8k:1 tm:8k:1"}
OLD_TREE=.gpu/old ab_runs "$RUNS" ${MODES:-fp16,turbo3-asym}
(cd $OUT && tar czf turbo3-words-b1.tgz r && rm -rf r)
