"""The GPU under `event_loop_overlap` with `scheduler.overlap_timing: pipelined`:
every forward holds the TP group's GPU resource, one at a time, while the
scheduler's CPU work for the next batch runs beside it (docs/SCHEDULER.md, "The
overlap loop in time")."""

from __future__ import annotations

from pathlib import Path

import filecmp
import subprocess
import sys

import pytest

from sim.cluster import Cluster
from sim.runner import prepare, run_scenario
from sim.scenario import load_scenario

from conftest import STEP_BY_STEP

ROOT = Path(__file__).resolve().parents[1]
EPS_US = 0.002  # trace times are rounded to 1 ns
PIPELINED = "scheduler.overlap_timing=pipelined"
SERIAL = "scheduler.overlap_timing=serial"


def _forwards(*sets, requests=80):
    scn = load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                        [f"workload.num_requests={requests}", PIPELINED, *sets])
    _, cfg, cost, workload = prepare(scn)
    events: list = []
    sim = Cluster(cfg, workload, cost, trace_events=events)
    sim.run()
    spans = sorted((e["ts"], e["ts"] + e.get("dur", 0.0), e["name"])
                   for e in events if e["cat"] == "forward" and e["tid"] == 0)
    return spans, sim


def test_forwards_take_the_gpu_one_at_a_time_and_a_prefill_queues_behind_a_decode():
    spans, sim = _forwards()
    names = {n for _, _, n in spans}
    assert names == {"prefill", "decode"}
    for (s0, e0, _), (s1, _, _) in zip(spans, spans[1:]):
        assert s1 >= e0 - EPS_US  # no two forwards on the GPU at once
    # prefills launched while a decode step was running began at its end
    queued = [1 for (_, e0, n0), (s1, _, n1) in zip(spans, spans[1:])
              if n0 == "decode" and n1 == "prefill" and abs(s1 - e0) <= EPS_US]
    assert len(queued) >= 10
    # the GPU's busy time is its forwards' time, and nothing else
    busy_us = sum(e - s for s, e, _ in spans)
    assert abs(sim.instances[0].busy_s * 1e6 - busy_us) <= EPS_US * len(spans) + 1e-6 * busy_us


def test_the_next_iterations_cache_sync_runs_while_the_gpu_decodes():
    spans, sim = _forwards()
    sync_us = sim.instances[0].cost.sync_time(2, "gloo") * 1e6
    assert sync_us > 0  # TP 2 over gloo: every iteration pays its sync on the CPU
    pairs = [(e0, s1) for (_, e0, n0), (s1, _, n1) in zip(spans, spans[1:])
             if n0 == n1 == "decode"]
    back_to_back = sum(1 for e0, s1 in pairs if s1 - e0 <= EPS_US)
    # Most decode steps follow the one before at once: the sync of the iteration that
    # launches a step ran while its predecessor computed. Charged serially, every
    # step would wait a sync (67 us here) behind the one before.
    assert len(pairs) >= 100 and back_to_back >= 0.9 * len(pairs)
    gaps = [s1 - e0 for e0, s1 in pairs if s1 - e0 > EPS_US]
    # the rest follow an idle GPU: the loop had nothing to run in between
    assert all(g >= sync_us - EPS_US for g in gaps)


@pytest.mark.parametrize("name,seed", [("quickstart", 0), ("quickstart", 3), ("capacity_wb_vs_wt", 0),
                                       ("capacity_wb_vs_wt", 5), ("storage_mooncake", 1),
                                       ("hybrid_swa", 2), ("hybrid_mamba", 4),
                                       ("jitter_ack_delay", 1), ("host_pressure_reclaim", 2),
                                       # a finisher's insert gives rank 0 alone a write in
                                       # flight: the next iteration's writing_check hangs
                                       ("jitter_pre_26921", 161)])
def test_pipelined_decode_runs_write_what_a_step_by_step_loop_writes(name, seed, tmp_path):
    """Runs of decode steps launched as one forward (the steps after the first stand
    for iterations whose sync the step before hides) against one step per iteration,
    each a forward of its own on the GPU: byte-identical results."""
    sets = ["workload.num_requests=60", f"seed={seed}", PIPELINED]
    run_scenario(load_scenario(ROOT / "scenarios" / f"{name}.yaml", sets), tmp_path / "fast")
    run_scenario(load_scenario(ROOT / "scenarios" / f"{name}.yaml", sets + [STEP_BY_STEP]),
                 tmp_path / "plain")
    names = sorted(p.name for p in (tmp_path / "fast").iterdir())
    _, mismatch, errors = filecmp.cmpfiles(tmp_path / "fast", tmp_path / "plain", names,
                                           shallow=False)
    assert not mismatch and not errors


def _run_counting_events(path: Path, sets: list, out: Path, monkeypatch) -> int:
    """Run ``path`` into ``out`` (results, trace and op-traces); the SimPy events it
    scheduled."""
    import simpy
    counted = [0]
    schedule = simpy.Environment.schedule

    def counting(env, event, priority=1, delay=0):
        counted[0] += 1
        schedule(env, event, priority, delay)
    monkeypatch.setattr(simpy.Environment, "schedule", counting)
    run_scenario(load_scenario(path, sets), out / "results", trace_out=str(out / "trace.json"),
                 record_ops_dir=out / "ops")
    monkeypatch.setattr(simpy.Environment, "schedule", schedule)
    return counted[0]


@pytest.mark.parametrize("name,sets", [("quickstart", ["seed=0"]), ("quickstart", ["seed=3", "tp=8"]),
                                       ("quickstart", ["dp=2", "tp=2"]),
                                       ("capacity_wb_vs_wt", ["seed=5", "tp=2"]),
                                       ("storage_mooncake", ["seed=1"]), ("hybrid_swa", ["seed=2"]),
                                       ("hybrid_mamba", ["seed=4"]),
                                       ("jitter_ack_delay", ["seed=1"]),
                                       ("host_pressure_reclaim", ["seed=2"]),
                                       ("jitter_pre_26921", ["seed=161"])])
def test_a_decode_launch_ahead_of_its_sync_writes_what_waiting_for_the_sync_writes(
        name, sets, tmp_path, monkeypatch):
    """A pipelined decode launch made ahead of its iteration's cache sync, the wait
    after it covering the sync (``Forwards._sync_ahead``), against the sync waited
    first: byte-identical results, trace and op-traces, with fewer SimPy events
    (the merge happened)."""
    from sim.forwards import Forwards
    path = ROOT / "scenarios" / f"{name}.yaml"
    sets = ["workload.num_requests=60", PIPELINED, *sets]
    merged = _run_counting_events(path, sets, tmp_path / "merged", monkeypatch)
    monkeypatch.setattr(Forwards, "merge_sync_waits", False)
    plain = _run_counting_events(path, sets, tmp_path / "plain", monkeypatch)
    assert merged < plain
    a, b = tmp_path / "merged", tmp_path / "plain"
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert len(files) > 3
    # meta.json names the run's wall time and revision, not its result
    differ = [f for f in files if f.name != "meta.json" and not filecmp.cmp(a / f, b / f, shallow=False)]
    assert not differ


def test_pipelined_timing_changes_the_run():
    serial = run_scenario(load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                                        ["workload.num_requests=120", SERIAL]), None).summary
    piped = run_scenario(load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                                       ["workload.num_requests=120", PIPELINED]), None).summary
    assert serial["requests"] == piped["requests"] == 120
    assert piped["ttft_p50_s"] != serial["ttft_p50_s"]
    assert piped["sim_time_s"] != serial["sim_time_s"]


@pytest.mark.parametrize("sets,key", [(["scheduler.overlap=false"], "scheduler.overlap_timing"),
                                      (["engine.clock=steps"], "scheduler.overlap_timing")])
def test_pipelined_timing_needs_the_overlap_loop_on_the_time_clock(sets, key, tmp_path):
    args = [sys.executable, str(ROOT / "cli.py"), "run", str(ROOT / "scenarios" / "quickstart.yaml"),
            "-o", str(tmp_path / "r"), "--set", PIPELINED]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    line = out.stderr.strip().splitlines()
    assert len(line) == 1 and key in line[0] and "pipelined" in line[0], out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("sets,timing", [([], "pipelined"),
                                         (["scheduler.overlap=false"], "serial"),
                                         (["engine.clock=steps"], "serial"),
                                         ([SERIAL], "serial")])
def test_the_default_timing_is_pipelined_where_the_overlap_loop_runs_in_time(sets, timing):
    """Unset, `overlap_timing` is `event_loop_overlap`'s pipelined timing; with the
    normal loop or the step clock, which have no overlap in time, it is `serial` (no
    error: only an explicit `pipelined` there is one), and the resolved scenario
    says which, so that it loads back to the same run."""
    from sim.scenario import dump_resolved
    import yaml
    path = ROOT / "scenarios" / "quickstart.yaml"
    if "engine.clock=steps" in sets:
        path = next(p for p in sorted((ROOT / "scenarios" / "regressions").glob("*.yaml"))
                    if "clock: steps" in p.read_text())
    scn = load_scenario(path, sets)
    assert scn.scheduler.overlap_timing == timing
    assert yaml.safe_load(dump_resolved(scn))["scheduler"]["overlap_timing"] == timing
