# Two entry points for a fresh machine with Python 3.11: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: run test validate bench clean

$(BIN)/sigprop: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.test-deps: $(BIN)/sigprop
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

run: $(BIN)/sigprop
	$(BIN)/sigprop rules

test: $(VENV)/.test-deps
	$(BIN)/python -m pytest -q -n 2 -m "not slow"

# Full published-grid sweeps for every component; rewrites docs/validation.md.
validate: $(VENV)/.test-deps
	$(BIN)/python -m sigprop.mc.validate --out docs/validation.md

bench: $(BIN)/sigprop
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis
