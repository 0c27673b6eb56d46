# Shared by the A/B experiment scripts (merge-cols.sh, fold-v.sh); source it. $OUT/r holds the runs.
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=$PWD
mkdir -p $OUT/r
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader

# some MODES JSON: KVBENCH_ATTN_CONFIG giving each of the comma-separated MODES the knobs JSON
some() { python3 -c "import json,sys; print(json.dumps({m: json.loads(sys.argv[2]) for m in sys.argv[1].split(',')}))" "$1" "$2"; }

# ab_run N CONFIG CONTEXTS BATCH MODES [LABEL]: decode-bench of dummy Llama-3.1-8B under KVBENCH_ATTN_CONFIG=CONFIG
# into $OUT/r/run-N, then its one-line summary (scripts/exp/bench_summary.py); $AB_FLAGS: more decode-bench flags
ab_run() {
  KVBENCH_ATTN_CONFIG="$2" timeout ${AB_TIMEOUT:-120} python3 -m kvbench decode-bench --model dummy:llama-3.1-8b \
    --modes $5 --contexts $3 --batch $4 --warmup 8 --gen 64 --repeats 3 --quiet --devices 0 ${AB_FLAGS:-} \
    --out $OUT/r/run-$1 > $OUT/r/run-$1.log 2>&1
  echo "run $1 (${6:-} $3 B=$4) rc=$? t=$SECONDS"
  python3 scripts/exp/bench_summary.py $OUT/r/run-$1/bench.csv || tail -5 $OUT/r/run-$1.log
}

# ab_runs "RUNS" MODES: each variant:contexts:batch of RUNS in order, an ab_run under ${V[variant]} (the
# caller's associative array of KVBENCH_ATTN_CONFIG values), numbered from $RUN0 + 1, skipped past BUDGET_S.
# $OLD_TREE: a folder holding another checkout's kvbench/ and scripts/exp/; variant `old` runs from there.
ab_runs() {
  local n=${RUN0:-0} run v ctx batch
  for run in $1; do
    IFS=: read -r v ctx batch <<< "$run"; n=$((n + 1))
    [ $SECONDS -gt ${BUDGET_S:-520} ] && { echo "run $n skipped: time"; continue; }
    if [ $v = old ] && [ -n "${OLD_TREE:-}" ]; then
      (cd $OLD_TREE && PYTHONPATH=$PWD ab_run $n "${V[$v]}" $ctx $batch $2 $v)
    else
      ab_run $n "${V[$v]}" $ctx $batch $2 $v
    fi
  done
}

# ab_tests FILE...: the pytest -k "$TESTS" selection of FILEs on compiled kernels, until BUDGET_S (+60 s)
ab_tests() {
  [ -n "${TESTS:-}" ] && [ $SECONDS -lt ${BUDGET_S:-520} ] || return 0
  KVBENCH_TEST_DEVICE=cuda TRITON_INTERPRET=0 timeout $((${BUDGET_S:-520} + 60 - SECONDS)) python3 -m pytest -q \
    -p no:cacheprovider "$@" -k "$TESTS" > $OUT/r/tests.txt 2>&1
  echo "tests rc=$? t=$SECONDS"; tail -3 $OUT/r/tests.txt
}

# ab_stamps NAME CONFIG MODES: per-program timer stamps (scripts/exp/tail_stamps.py) at 8K, batch 1 under
# KVBENCH_ATTN_CONFIG=CONFIG into $OUT/r/stamps-NAME.txt, skipped past BUDGET_S
ab_stamps() {
  [ $SECONDS -gt ${BUDGET_S:-520} ] && { echo "stamps $1 skipped: time"; return 0; }
  echo "== stamps $1"
  KVBENCH_ATTN_CONFIG="$2" timeout 120 python3 scripts/exp/tail_stamps.py --modes $3 --context 8192 --batch 1 \
    > $OUT/r/stamps-$1.txt 2>&1
  echo "rc=$? t=$SECONDS"; grep -v "^#" $OUT/r/stamps-$1.txt | cut -c1-220
}
