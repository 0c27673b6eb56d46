#!/usr/bin/env bash
# Twenty-eighth session: is the 32K float32 decode the same run to run, and machine to machine?
# (scripts/exp/repro_probe.py; PROBE_ARGS: more of its flags, e.g. "--dtypes float32,bfloat16 --repeats 1"). Runs on a machine where an earlier call joined the default model into
# /tmp/kvbench-model and installed the gguf wheel into /tmp/site (scripts/h200.sh BN, or model-lib.sh).
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=/tmp/site:$PWD
G=/tmp/kvbench-model/SmolLM2-135M-Instruct.Q4_1.gguf
[[ -f $G ]] || { echo "the model is not on this machine: run scripts/h200.sh BN first"; exit 3; }
mkdir -p $OUT/repro-probe
for n in ${PROBE_RUNS:-1 2}; do
  timeout ${PROBE_TIMEOUT:-150} python3 scripts/exp/repro_probe.py --model $G --contexts ${PROBE_CONTEXTS:-32768} \
    --modes ${PROBE_MODES:-int8} ${PROBE_ARGS:-} --json $OUT/repro-probe/probe-$n.json > $OUT/repro-probe/probe-$n.txt 2>&1
  echo "probe $n rc=$? t=$SECONDS"; grep -v "^# \(torch\|cuda\|cudnn\)" $OUT/repro-probe/probe-$n.txt | tail -12
done
