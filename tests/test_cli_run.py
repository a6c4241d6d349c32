"""`hicache-sim run` as a user meets it: exit codes, one-line errors, results folders."""

import json
import signal
import subprocess
import sys

import pandas as pd
import pytest

from conftest import ROOT
from sim.metrics import REQUEST_COLUMNS, TIMESERIES_COLUMNS
from sim.runner import run_scenario
from sim.scenario import load_scenario

CLI = [sys.executable, str(ROOT / "cli.py")]
SCN = ROOT / "scenarios"


def cli(*args, **kw):
    return subprocess.run(CLI + [str(a) for a in args], capture_output=True, text=True, cwd=ROOT, **kw)


def test_run_writes_a_results_folder_pandas_can_load(tmp_path):
    out = tmp_path / "res"
    p = cli("run", SCN / "quickstart.yaml", "-o", out, "--set", "workload.num_requests=60",
            "--trace-out", tmp_path / "trace.json", "--plots")
    assert p.returncode == 0, p.stderr
    req = pd.read_parquet(out / "requests.parquet")
    ts = pd.read_parquet(out / "timeseries.parquet")
    assert list(req.columns) == REQUEST_COLUMNS and list(ts.columns) == TIMESERIES_COLUMNS
    assert len(req) == 60 and (req["ttft_s"] > 0).all()
    tokens = req["device_hit_tokens"] + req["host_hit_tokens"] + req["miss_tokens"]
    assert (tokens == req["input_tokens"]).all()
    meta = json.loads((out / "meta.json").read_text())
    assert meta["partial"] is False and meta["cost_profile"] == "h200-sxm" and meta["seed"] == 1
    div = json.loads((out / "divergence.json").read_text())
    assert div["verdict"] == "agree"
    assert load_scenario(out / "scenario.yaml").name == "quickstart"  # resolved and reloadable
    trace = json.loads((tmp_path / "trace.json").read_text())
    names = {e["name"] for e in trace["traceEvents"]}
    assert {"thread_name", "load_copy"} <= names
    assert list((out / "plots").glob("*.png"))
    assert "hit rate" in p.stdout and str(out) in p.stdout


def test_seed_override_changes_the_run_and_same_seed_repeats_it(tmp_path):
    a, b, c = (tmp_path / x for x in "abc")
    for out, seed in ((a, 5), (b, 5), (c, 6)):
        assert cli("run", SCN / "quickstart.yaml", "-o", out, "--seed", seed, "--quiet",
                   "--set", "workload.num_requests=40").returncode == 0
    assert (a / "requests.parquet").read_bytes() == (b / "requests.parquet").read_bytes()
    assert (a / "requests.parquet").read_bytes() != (c / "requests.parquet").read_bytes()


@pytest.mark.parametrize("args,needle", [
    (["run", "nope.yaml"], "nope.yaml"),
    (["run", SCN / "quickstart.yaml", "--set", "host.ratoi=2"], "host.ratoi"),
    (["run", SCN / "quickstart.yaml", "--set", "tp=3"], "tp"),
    (["run", SCN / "quickstart.yaml", "--collective", "nccl"], "invalid choice"),
    (["run"], "required"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_arguments_are_one_line_errors(args, needle):
    p = cli(*args)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], p.stderr
    assert "Traceback" not in p.stderr


def test_a_digest_assertion_exits_3_with_sglangs_message(tmp_path):
    p = cli("run", SCN / "jitter_id_drift.yaml", "-o", tmp_path / "r", "--quiet")
    assert p.returncode == 3
    assert "write_back duplicate-reclaim victims diverged across PP/TP ranks" in p.stderr
    assert json.loads((tmp_path / "r" / "meta.json").read_text())["halted"] == "digest_mismatch"


def test_interrupt_inside_the_run_leaves_a_valid_partial_result(tmp_path):
    scn = load_scenario(SCN / "quickstart.yaml", [])

    def interrupt(now, metrics):
        if metrics.done == 50:
            raise KeyboardInterrupt

    res = run_scenario(scn, tmp_path / "p", progress=interrupt)
    assert res.partial
    meta = json.loads((tmp_path / "p" / "meta.json").read_text())
    assert meta["partial"] is True and meta["requests_done"] == 50
    assert len(pd.read_parquet(tmp_path / "p" / "requests.parquet")) == 50


# What each phase's Ctrl-C leaves (sim/interrupt.py): nothing before the simulation,
# a partial folder during it, the whole folder after it.
CTRL_C_LEAVES = {"locked": "nothing", "simulating": "partial", "simulated": "complete",
                 "staging": "complete", "committing": "complete", "committed": "complete"}


def test_every_interrupt_phase_is_tested():
    from sim.interrupt import PHASES

    assert tuple(CTRL_C_LEAVES) == PHASES


# Over an earlier folder where it matters: before the run (the old one stays), during
# it, and between the two renames (the old one renamed away, the new not yet in place).
@pytest.mark.parametrize("phase,earlier", [(p, False) for p in CTRL_C_LEAVES]
                         + [(p, True) for p in ("locked", "simulating", "committing")])
def test_ctrl_c_on_the_command_line(tmp_path, phase, earlier):
    # The SIGINT is delivered by the process itself at the named phase
    # (HICACHE_SIM_INTERRUPT_AT): the same point on every machine, however loaded.
    import os

    out = tmp_path / "q"
    args = ["run", SCN / "quickstart.yaml", "-o", out, "--quiet", "--set", "workload.num_requests=30"]
    if earlier:
        assert cli(*args, "--seed", "7").returncode == 0
        old = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    p = cli(*args, env={**os.environ, "HICACHE_SIM_INTERRUPT_AT": phase})
    assert p.returncode == 130, p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    leaves = CTRL_C_LEAVES[phase]
    if leaves == "nothing":
        if earlier:  # the earlier folder, untouched
            assert {q.name: q.read_bytes() for q in out.iterdir() if q.is_file()} == old
        else:
            assert not out.exists()
    else:
        meta = json.loads((out / "meta.json").read_text())
        assert meta["seed"] == 1 and meta["partial"] is (leaves == "partial")
        done = len(pd.read_parquet(out / "requests.parquet"))
        assert done == meta["requests_done"] and (done == 30) is (leaves == "complete")
    left = ["q"] if (earlier or leaves != "nothing") else []
    assert sorted(q.name for q in tmp_path.iterdir()) == left  # no lock, no staging folder


def test_a_run_leaves_the_sigint_handler_as_it_found_it(tmp_path):
    # A sweep or census worker ignores SIGINT (its parent handles Ctrl-C): a run there
    # keeps ignoring it; in a command, the handler is Python's again after the run.
    scn = load_scenario(SCN / "quickstart.yaml", ["workload.num_requests=10"])
    seen = []

    def watch(now, metrics):
        seen.append(signal.getsignal(signal.SIGINT))

    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        run_scenario(scn, tmp_path / "a", progress=watch)
        assert set(seen) == {signal.SIG_IGN} and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, old)
    seen.clear()
    run_scenario(scn, tmp_path / "b", progress=watch)
    assert seen and signal.default_int_handler not in seen  # the run's own, deferring one
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_ctrl_c_after_a_run_without_a_folder_reaches_the_caller(monkeypatch):
    # census and plan run without a results folder: nothing to finish writing, so a
    # Ctrl-C that came after the simulation ended is raised, not swallowed
    monkeypatch.setenv("HICACHE_SIM_INTERRUPT_AT", "simulated")
    scn = load_scenario(SCN / "quickstart.yaml", ["workload.num_requests=10"])
    with pytest.raises(KeyboardInterrupt):
        run_scenario(scn, None)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_bad_trace_record_mid_run_is_a_one_line_error(tmp_path):
    (tmp_path / "t.jsonl").write_text(
        '{"arrival_s": 0.1, "input_len": 100, "output_len": 5, "block_size": 64, "blocks": [1, 2]}\n'
        '{"arrival_s": "x"}\n')
    (tmp_path / "s.yaml").write_text(
        "name: badtrace\nmodel: {preset: llama-3.1-8b}\npage_size: 64\ndevice: {tokens: 65536}\n"
        "workload: {kind: trace, format: generic, path: t.jsonl}\n")
    p = cli("run", tmp_path / "s.yaml", "-o", tmp_path / "out", "--quiet")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "t.jsonl:2" in lines[0] and "arrival_s" in lines[0], p.stderr


def test_a_summary_with_no_finished_request_is_quiet():
    # Ctrl-C before the first request finishes: the summary has no TTFT, and numpy must
    # not print an "All-NaN slice" warning next to the one "interrupted" line.
    import warnings

    from sim.config import SimConfig
    from sim.events import Simulation

    sim = Simulation(SimConfig(tp=1), [])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        summary = sim.metrics.summary(sim.group.cohorts[0].tree)
    assert summary["ttft_p50_s"] is None and summary["ttft_p99_s"] is None  # strict JSON
