# Two commands do all the set-up: `make run` and `make test`. Both build .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench clean venv

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/hicache-sim run scenarios/quickstart.yaml -o results/quickstart --plots

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 tests

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_tree.py
	$(BIN)/python benchmarks/bench_sim.py
	$(BIN)/python benchmarks/bench_plan.py

clean:
	rm -rf $(VENV) results
