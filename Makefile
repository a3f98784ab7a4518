# The two commands of the README: `make demo` (the service with the built-in twin, on SQLite)
# and `make test` (the test suite). Each creates its virtual environment on first use: the demo
# runs the plain package, as a user installs it (no torch), with its figures' extra (plots); the
# tests need the train extra too.
# Python 3.11 (pyproject's requires-python): `make PYTHON=/path/to/python3.11` to choose one.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
# torch's CPU build, from PyTorch's own index where it is reachable (PyPI's torch is the CUDA
# build: gigabytes), else from the machine's usual index.
TORCH := torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_VENV := .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed

.PHONY: help demo test lint venv python

help:
	@echo "make demo   the service with the built-in twin, on SQLite (a browser page, ~2 min)"
	@echo "make test   the test suite (its environment first: ~5 min, then ~13 min in two processes)"
	@echo "make lint   ruff and mypy"
	@echo "make venv   the test environment alone (.venv)"

python:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null || \
	  { echo "twinwatch needs Python 3.11: make PYTHON=/path/to/python3.11 (found: $(PYTHON))"; \
	    exit 1; }

venv: $(STAMP)

$(STAMP): pyproject.toml | python
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and exactly, its CPU build: a range could pull gigabytes of CUDA.
	$(BIN)/pip install --quiet --timeout 10 --retries 0 --index-url $(TORCH_INDEX) $(TORCH) \
	  || $(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -e ".[train,plots,dev]"
	touch $(STAMP)

$(DEMO_STAMP): pyproject.toml | python
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/pip install --quiet --upgrade pip
	$(DEMO_VENV)/bin/pip install --quiet ".[plots]"
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	# Not editable: reinstall the package itself (seconds), so the demo runs this checkout.
	$(DEMO_VENV)/bin/pip install --quiet --no-deps --force-reinstall .
	$(DEMO_VENV)/bin/twinwatch demo

test: $(STAMP)
	$(BIN)/pytest -q -n 2

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
