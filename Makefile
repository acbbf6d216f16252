# aheadrank — every target runs inside .venv, which `make setup` creates from the project's own files.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup test lint demo bench clean

$(BIN)/.installed: pyproject.toml requirements/constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, from the local CPU wheel; the constraint keeps every later install from replacing it
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c requirements/constraints.txt -e '.[dev]'
	touch $@

setup: $(BIN)/.installed

test: setup
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

demo: setup
	$(BIN)/python -m aheadrank.demo

bench: setup
	$(BIN)/python bench/speed.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
