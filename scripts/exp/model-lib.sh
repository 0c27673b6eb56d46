# Shared by the GPU scripts that need the default model (path-gap.sh, write-gap.sh, repro-probe.sh,
# history-probe.sh); source it. The model comes over in thirds: carry .gpu/p0, then .gpu/p1 (each call:
# mkdir -p /tmp/kvbench-model && cp .gpu/pN/* /tmp/kvbench-model/), then the script with carry .gpu/p2 .gpu/whl
# on the same machine. A later call on that machine needs no carry: the model and the wheel are left in /tmp.
# Sets $G (the GGUF).
set -u
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
M=/tmp/kvbench-model G=/tmp/kvbench-model/SmolLM2-135M-Instruct.Q4_1.gguf
if [[ -d .gpu/p2 ]]; then
  cp .gpu/p2/* $M/
  [[ -f $M/part00 && -f $M/part01 && -f $M/part02 ]] || { echo "a third of the model is missing"; exit 3; }
  cat $M/part0* > $G && sha256sum $G
fi
[[ -f $G ]] || { echo "the model is not on this machine: carry .gpu/p0, .gpu/p1, then .gpu/p2"; exit 3; }
[[ -d /tmp/site ]] || python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
