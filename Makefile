# opencomposer: the two commands are `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: setup demo test test-all bench lint clean system-deps

setup: $(STAMP) system-deps

# torch is pinned and installed first so that nothing resolves a CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -e ".[dev]"
	touch $(STAMP)

# The sandbox needs bubblewrap; install it from Debian when we are root and it is missing.
system-deps:
	@if ! command -v bwrap >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing bubblewrap"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
	  else \
	    echo "warning: bwrap not found and not root; sandboxed tests will be skipped" >&2; \
	  fi; \
	fi

demo: setup
	$(VENV)/bin/opencomposer quickstart

test: setup
	$(PY) -m pytest -q -m "not slow and not gpu"

test-all: setup
	$(PY) -m pytest -q -m "not gpu"

bench: setup
	for f in benchmarks/*.py; do $(PY) $$f || exit 1; done

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache
