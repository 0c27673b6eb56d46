#!/usr/bin/env bash
# Twenty-eighth session: is the 32K float32 decode the same run to run, and machine to machine?
# (scripts/exp/repro_probe.py; PROBE_ARGS: more of its flags, e.g. "--dtypes float32,bfloat16 --repeats 1").
# The default model comes over in thirds (scripts/exp/model-lib.sh says how).
source scripts/exp/model-lib.sh
mkdir -p $OUT/repro-probe
for n in ${PROBE_RUNS:-1 2}; do
  timeout ${PROBE_TIMEOUT:-150} python3 scripts/exp/repro_probe.py --model $G --contexts ${PROBE_CONTEXTS:-32768} \
    --modes ${PROBE_MODES:-int8} ${PROBE_ARGS:-} --json $OUT/repro-probe/probe-$n.json > $OUT/repro-probe/probe-$n.txt 2>&1
  echo "probe $n rc=$? t=$SECONDS"; grep -v "^# \(torch\|cuda\|cudnn\)" $OUT/repro-probe/probe-$n.txt | tail -12
done
