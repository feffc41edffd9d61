# Two entry points: `make run` (main job on built-in data) and `make test` (whole suite).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.core: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[test]"
	touch $@ $(VENV)/.core

run: $(VENV)/.core
	$(BIN)/silofl run

test: $(VENV)/.test
	$(BIN)/python -m pytest

bench: $(VENV)/.core
	$(BIN)/python benchmarks/bench_engine.py

clean:
	rm -rf $(VENV) runs
