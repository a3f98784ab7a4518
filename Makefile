# The two commands of the README: `make demo` (the service with the built-in twin, on SQLite)
# and `make test` (the test suite). Each creates its virtual environment on first use: the demo
# runs the plain package, as a user installs it (no torch), with its figures' extra (plots); the
# tests need the train extra too.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_VENV := .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed

.PHONY: demo test lint venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and exactly: the CPU build; a range could pull gigabytes of CUDA.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[train,plots,dev]"
	touch $(STAMP)

$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/pip install --quiet --upgrade pip
	$(DEMO_VENV)/bin/pip install --quiet ".[plots]"
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	# Not editable: reinstall the package itself (seconds), so the demo runs this checkout.
	$(DEMO_VENV)/bin/pip install --quiet --no-deps --force-reinstall .
	$(DEMO_VENV)/bin/twinwatch demo

test: $(STAMP)
	$(BIN)/pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
