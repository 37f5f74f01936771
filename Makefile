# One entry point for people and CI. Every target sets up what it needs: the virtual environment
# (.venv, rebuilt when pyproject.toml changes) and the test control plane's binaries (built from
# their Go modules into ~/.cache/heteroserve/bin once, then reused).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: help venv tools lint test unit integration cluster-up cluster-down clean

help:
	@echo "make test          lint + every test tier (builds what it needs)"
	@echo "make unit          fast tests: no cluster, no network"
	@echo "make integration   tests against the real test control plane"
	@echo "make cluster-up    start the test control plane; prints its kubeconfig path"
	@echo "make cluster-down  stop it"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $@

venv: $(STAMP)

tools:
	@bash tests/cluster/build-tools.sh

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

test: venv tools lint
	$(PY) -m pytest $(PYTEST_ARGS)

unit: venv
	$(PY) -m pytest -m "not integration" $(PYTEST_ARGS)

integration: venv tools
	$(PY) -m pytest -m integration $(PYTEST_ARGS)

cluster-up: venv tools
	@$(PY) -m tests.cluster up

cluster-down: venv
	@$(PY) -m tests.cluster down

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
