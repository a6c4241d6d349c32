# Two commands do all the set-up: `make run` and `make test`. Both build .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench clean venv browser

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/hicache-sim run scenarios/quickstart.yaml -o results/quickstart --plots

# Headless Chromium (Debian's package) for tests/test_report_browser.py, installed when
# missing; that test fails, never skips, without it. As root on Debian (CI), or with sudo.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  command -v apt-get >/dev/null 2>&1 || { \
	    echo "make browser: chromium is missing and there is no apt-get; install Chromium" >&2; exit 1; }; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium; }

test: $(STAMP) browser
	$(BIN)/python -m pytest -n 2 tests

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_tree.py
	$(BIN)/python benchmarks/bench_sim.py
	$(BIN)/python benchmarks/bench_plan.py

clean:
	rm -rf $(VENV) results
