# Two commands do all the set-up: `make run` and `make test`. Both build .venv first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test bench clean venv browser figures need-oracle conformance-sglang conformance-hybrid-sglang \
	conformance-storage-sglang conformance-hybrid-engine-sglang conformance-buffer-sglang \
	conformance-server conformance-server-refresh conformance-tp2 \
	conformance-rust-sglang conformance-schedule-sglang

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/hicache-sim run scenarios/quickstart.yaml -o results/quickstart --plots

# Headless Chromium (Debian's package) for tests/test_report_browser.py; that test fails,
# never skips, without it. Installing it is system-wide (apt-get, as root or with sudo),
# so it happens only with consent: INSTALL_BROWSER=1, or CI=true (a CI machine). Without
# either, one line says what is missing and how to get it, and `make test` goes on.
INSTALL_BROWSER ?= $(if $(filter true 1,$(CI)),1,)
BROWSER_MISSING := headless Chromium is missing (tests/test_report_browser.py needs it): run 'make browser INSTALL_BROWSER=1' to apt-get install Debian's chromium system-wide (as root or with sudo), or install chromium yourself
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if [ "$(INSTALL_BROWSER)" != 1 ]; then echo "make browser: $(BROWSER_MISSING)" >&2; exit 0; fi; \
	  command -v apt-get >/dev/null 2>&1 || { \
	    echo "make browser: chromium is missing and there is no apt-get; install Chromium" >&2; exit 1; }; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium; }

test: $(STAMP) browser
	$(BIN)/python -m pytest -n 2 tests

# The differential test against SGLang 0.5.23's real tree (not part of `make test`: it
# builds a 2.3 GB CPU venv). Every shipped scenario, 200 requests, one TP-2 group:
# op-traces recorded by `run --record-ops`, replayed on SGLang (tools/sglang_oracle) and
# through `replay-ops`, compared line by line. Both tree cores: the Python core
# (cache.tree_core=python, through ../shared/oracle/) and the Rust core a default server
# runs (through ../shared/oracle/rust/). Exits non-zero at the first difference.
SGLANG_ORACLE ?= ../shared/oracle
# The oracle is not in the repository: it is oracle/ of the project's shared/ folder,
# which sits beside a checkout. Without it, one line instead of a traceback.
ORACLE_TARGETS := conformance-sglang conformance-hybrid-sglang conformance-storage-sglang \
	conformance-hybrid-engine-sglang conformance-buffer-sglang conformance-server \
	conformance-server-refresh conformance-rust-sglang conformance-schedule-sglang
need-oracle:
	@test -f $(SGLANG_ORACLE)/setup.sh || { echo "make $(filter $(ORACLE_TARGETS),$(MAKECMDGOALS)): \
	needs SGLang 0.5.23's oracle at $(SGLANG_ORACLE) (oracle/ of the project's shared/ folder \
	beside the repository, not part of it); put it there or pass SGLANG_ORACLE=DIR" >&2; exit 2; }
conformance-sglang: need-oracle $(STAMP)
	bash $(SGLANG_ORACLE)/setup.sh
	HICACHE_SGLANG_ORACLE=$(abspath $(SGLANG_ORACLE)) $(BIN)/python tools/conformance_sglang.py

# Rebuild data/conformance/hybrid/ from SGLang 0.5.23's own (FULL, SWA) and (FULL, MAMBA)
# cores, with SGLang's sanity_check after every op, and fail if any vendored byte changed
# (docs/HYBRID.md §7).
conformance-hybrid-sglang: need-oracle $(STAMP)
	bash $(SGLANG_ORACLE)/setup.sh
	HICACHE_SGLANG_ORACLE=$(abspath $(SGLANG_ORACLE)) \
	  $${SGLANG_ORACLE_VENV:-$${TMPDIR:-/tmp}/sglang-oracle-venv}/bin/python \
	  tools/sglang_oracle/make_hybrid_cases.py --check
	git diff --exit-code -- data/conformance/hybrid

# Rebuild data/conformance/hybrid_engine/: the TP engine's recorded hybrid op-traces
# replayed on SGLang 0.5.23's own cores (docs/HYBRID.md §10.5), and fail if any vendored
# byte changed.
conformance-hybrid-engine-sglang: need-oracle $(STAMP)
	bash $(SGLANG_ORACLE)/setup.sh
	HICACHE_SGLANG_ORACLE=$(abspath $(SGLANG_ORACLE)) \
	  SGLANG_ORACLE_VENV=$${SGLANG_ORACLE_VENV:-$${TMPDIR:-/tmp}/sglang-oracle-venv} \
	  $(BIN)/python tools/sglang_oracle/make_hybrid_engine_cases.py --check
	git diff --exit-code -- data/conformance/hybrid_engine

# Rebuild data/conformance/storage/ (storage (L3) ops, docs/OPTRACE.md §14) from SGLang
# 0.5.23's own tree, with its sanity_check after every op, and fail if any vendored byte
# changed (docs/STORAGE.md §6).
conformance-storage-sglang: need-oracle $(STAMP)
	bash $(SGLANG_ORACLE)/setup.sh
	HICACHE_SGLANG_ORACLE=$(abspath $(SGLANG_ORACLE)) \
	  $${SGLANG_ORACLE_VENV:-$${TMPDIR:-/tmp}/sglang-oracle-venv}/bin/python \
	  tools/sglang_oracle/make_storage_cases.py --check
	git diff --exit-code -- data/conformance/storage

# buffer_only cases (docs/OPTRACE.md §15): engine recordings replayed on SGLang's core.
conformance-buffer-sglang: need-oracle $(STAMP)
	bash $(SGLANG_ORACLE)/setup.sh
	$(BIN)/python tools/sglang_oracle/make_buffer_cases.py --check
	git diff --exit-code -- data/conformance/buffer

# The differential test against SGLang 0.5.23's real server (tools/sglang_server/README.md):
# every generated workload x the three write policies x both loops through the server
# harness ($(SGLANG_ORACLE)/server, cached in results/sglang-server/harness) and through
# `run --record-steps` under the step clock, compared step by step. Exits non-zero at
# the first differing step, showing both sides.
conformance-server: need-oracle $(STAMP)
	bash $(SGLANG_ORACLE)/server/setup.sh
	HICACHE_SGLANG_SERVER=$(abspath $(SGLANG_ORACLE))/server $(BIN)/python tools/conformance_server.py

# The engine's TP-2 outcomes under the harness's fault hooks against the vendored real
# TP-2 groups (data/conformance/tp2/, tools/sglang_server/tp2.py): outcome class,
# assertion step and text, a silent divergence's first differing step. No SGLang needed.
conformance-tp2: $(STAMP)
	$(BIN)/python tools/conformance_tp2.py

# Rewrite data/conformance/server/ (the vendored harness outputs tests/test_server_refs.py
# reads) from the server harness.
conformance-server-refresh: need-oracle $(STAMP)
	bash $(SGLANG_ORACLE)/server/setup.sh
	HICACHE_SGLANG_SERVER=$(abspath $(SGLANG_ORACLE))/server $(BIN)/python tools/sglang_server/vendor_refs.py

# Rebuild data/conformance/rust/ (the FULL cases on SGLang's Rust core under a server's
# ids, tests/test_tree_core.py) and fail if any vendored byte changed.
conformance-rust-sglang: need-oracle $(STAMP)
	bash $(SGLANG_ORACLE)/setup.sh
	RUST_BACKTRACE=0 HICACHE_SGLANG_ORACLE=$(abspath $(SGLANG_ORACLE)) \
	  $${SGLANG_ORACLE_VENV:-$${TMPDIR:-/tmp}/sglang-oracle-venv}/bin/python \
	  tools/sglang_oracle/make_rust_cases.py
	git diff --exit-code -- data/conformance/rust

# Rebuild data/conformance/schedule/cases.json from SGLang's own SchedulePolicy (it
# imports the scheduler's modules: the server oracle's venv, ../shared/oracle/server/).
conformance-schedule-sglang: need-oracle $(STAMP)
	HICACHE_SGLANG_ORACLE=$(abspath $(SGLANG_ORACLE)) \
	  $${SGLANG_SERVER_VENV:-$${TMPDIR:-/tmp}/sglang-server-venv}/bin/python \
	  tools/sglang_oracle/make_schedule_cases.py
	git diff --exit-code -- data/conformance/schedule

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_tree.py
	$(BIN)/python benchmarks/bench_sim.py
	$(BIN)/python benchmarks/bench_plan.py

# Regenerate the README's figures: docs/img/FIGURES.md lists each one and the command
# that makes it (tools/figures.py runs them; `--list` prints them, `--only NAME` one).
# Several take minutes: re-run after a change that moves the README's numbers.
figures: $(STAMP)
	$(BIN)/python tools/figures.py $(if $(ONLY),--only $(ONLY),)

clean:
	rm -rf $(VENV) results
