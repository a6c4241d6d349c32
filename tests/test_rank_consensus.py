"""collective.rank_consensus: SGLang's rank consensus checker (sglang #34406).

Each rank's @rank_consensus calls are logged as SGLang's decorator logs them and
compared across ranks event by event; the first difference stops the run where
SGLang's checker would kill the server.
"""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from conftest import ROOT
from sim import consensus
from sim.runner import run_scenario
from sim.scenario import load_scenario

SCN = ROOT / "scenarios"
CLI = [sys.executable, str(ROOT / "cli.py")]
SITES = {"match_prefix", "insert", "evict_for_alloc", "write_backup_storage",
         "_can_terminate_prefetch", "check_prefetch_progress"}


def _run(name, *sets):
    return run_scenario(load_scenario(SCN / f"{name}.yaml", list(sets)))


def test_off_by_default_and_silent_without_divergence():
    s = load_scenario(SCN / "quickstart.yaml", ["workload.num_requests=80"])
    assert s.collective.rank_consensus is False
    off = run_scenario(s)
    on = run_scenario(load_scenario(SCN / "quickstart.yaml", ["workload.num_requests=80",
                                                              "collective.rank_consensus=true"]))
    assert off.divergence["rank_consensus"] is None and on.divergence["rank_consensus"] is None
    assert on.divergence["verdict"] == off.divergence["verdict"] == "agree"
    # the checker observes; it changes nothing else
    assert {k: v for k, v in on.summary.items() if k != "wall_s"} == \
        {k: v for k, v in off.summary.items() if k != "wall_s"}
    log = on.sim.instances[0].group.cohorts[0].consensus
    names = {e.split(" ", 1)[0] for e in log}
    assert {"match_prefix", "insert", "evict_for_alloc"} <= names <= SITES
    assert all(" called params=" in a and " returns result=" in b for a, b in zip(log[::2], log[1::2]))


def test_a_divergence_is_caught_at_evict_for_alloc_before_the_digest(tmp_path):
    # seed 0: a seed whose first differing decision is evict_for_alloc's (under the
    # default pipelined timing; the scenario's own seed's is now an insert's)
    base = _run("jitter_device_capacity_skew", "seed=0", "on_divergence=halt")
    assert base.divergence["verdict"] == "detected" and base.divergence["detection_delay_s"] > 1.0
    p = subprocess.run(CLI + ["run", str(SCN / "jitter_device_capacity_skew.yaml"), "-o",
                              str(tmp_path / "r"), "--set", "seed=0",
                              "--set", "collective.rank_consensus=true",
                              "--set", "on_divergence=halt", "--quiet"],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 3
    line = p.stderr.strip().splitlines()[-1]
    assert "Found rank divergence" in line and "@rank_consensus evict_for_alloc" in line
    div = json.loads((tmp_path / "r" / "divergence.json").read_text())
    rc = div["rank_consensus"]
    assert div["verdict"] == "detected" and div["halted"] == "rank_consensus"
    assert rc["site"] == "evict_for_alloc" and div["digest_mismatch"] is None
    # rank 1's smaller pool asks for more: the first decision that differs
    assert rc["events"]["0"] != rc["events"]["1"]
    assert rc["t"] == div["first_true_divergence"]["t"] and div["detection_delay_s"] == 0.0


@pytest.mark.parametrize("name, jitter, site, verdict", [
    ("storage_mooncake", "jitter.host_capacity_skew={1: -640}", "match_prefix", "detected"),
    ("storage_slow_rank", "jitter.host_capacity_skew={1: -1280}", "insert", "detected"),
    # rank 1 admits in another order: its check_prefetch_progress names another request
    ("storage_mooncake_trace", "jitter.request_order={ranks: [1], swap_probability: 0.05, window: 2}",
     "check_prefetch_progress", "false_alarm"),
])
def test_divergences_are_caught_at_sglangs_check_points(name, jitter, site, verdict):
    # The normal loop: under the overlap loop the storage runs' ranks first part at a
    # prefetch_terminate all_reduce one of them skips (a hang; the checker's own worker
    # thread is not modelled past a blocked collective, docs/SERVER_ARTEFACTS.md).
    r = _run(name, "collective.rank_consensus=true", "on_divergence=halt", jitter,
             "limits.max_requests=400", "scheduler.overlap=false")
    rc = r.divergence["rank_consensus"]
    assert rc is not None and rc["site"] == site and r.divergence["verdict"] == verdict
    assert r.divergence["halted"] == "rank_consensus"
    off = _run(name, "on_divergence=halt", jitter, "limits.max_requests=400",
               "scheduler.overlap=false")
    assert off.divergence["rank_consensus"] is None  # the checker is what caught it


def test_rank_agreed_storage_faults_stay_silent():
    r = _run("storage_mooncake", "collective.rank_consensus=true", "on_divergence=halt",
             "jitter.storage_fail={ranks: [1]}")
    assert r.divergence["verdict"] == "absorbed" and r.divergence["rank_consensus"] is None
    logs = [c.consensus for c in r.sim.instances[0].group.cohorts]
    names = {e.split(" ", 1)[0] for log in logs for e in log}
    assert {"write_backup_storage", "check_prefetch_progress", "_can_terminate_prefetch"} <= names
    assert len({tuple(log) for log in logs}) == 1  # every replica logged the same events


def test_an_extra_call_on_one_rank_is_a_divergence():
    hits = []
    a = SimpleNamespace(ranks=[0], consensus=[])
    b = SimpleNamespace(ranks=[1], consensus=[])
    sim = SimpleNamespace(group=SimpleNamespace(cohorts=[a, b]), env=SimpleNamespace(now=1.0),
                          step_no=7, cfg=SimpleNamespace(on_divergence="record", tp=2),
                          obs=SimpleNamespace(rank_consensus=None,
                                              consensus_divergence=lambda *x: hits.append(x),
                                              compare=lambda *x, **k: None),
                          _trace=lambda *x, **k: None)
    consensus.record(sim, a, "insert", "len(params.key)=64", "result.prefix_len=0")
    consensus.record(sim, b, "insert", "len(params.key)=64", "result.prefix_len=0")
    assert not hits
    consensus.record(sim, b, "write_backup_storage", "<no check>", "<no check>")
    consensus.record(sim, a, "insert", "len(params.key)=128", "result.prefix_len=64")
    assert hits and hits[0][2] == "insert" and hits[0][3] == 2


def test_refused_on_a_hybrid_in_one_line():
    p = subprocess.run(CLI + ["validate", str(SCN / "hybrid_swa.yaml"), "--set",
                              "collective.rank_consensus=true"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "rank_consensus with model.hybrid_preset" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
