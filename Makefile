# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create .venv/ (Python >= 3.10) and install kvres with everything it needs into it.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.kvres-installed

.PHONY: install demo test lint typecheck unit bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[all,dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/kvres demo

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/python -m benchmarks.plan_scaling
	$(BIN)/python -m benchmarks.coldstore

clean:
	rm -rf $(VENV) build *.egg-info benchmarks/results
