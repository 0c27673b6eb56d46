#!/usr/bin/env bash
# Wheels the GPU machine lacks (it reaches no registry), into .gpu/whl beside the
# gguf wheel of ../shared/gpu/stage-model.sh: pytest (for `scripts/h200.sh k`, the
# kernel tests on compiled kernels) and the peer backends optimum-quanto and hqq
# with the dependencies the machine does not have (for `scripts/h200.sh p`).
# Python 3.12, manylinux x86_64, like the GPU machine; pure-Python wheels mostly.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .gpu/whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform any -d .gpu/whl \
  pytest pluggy iniconfig pygments \
  "optimum-quanto==0.2.7" ninja einops termcolor accelerate
# hqq ships as an sdist only: build its (pure-Python) wheel here
python3 -m pip wheel -q --no-deps -w .gpu/whl "hqq==0.2.8.post1"
ls -la .gpu/whl
du -sh .gpu/whl
