"""The GPU under `event_loop_overlap`: every forward holds the TP group's GPU
resource, one at a time, while the scheduler's CPU work for the next batch runs
beside it (docs/SCHEDULER.md, "The overlap loop in time")."""

from __future__ import annotations

from pathlib import Path

from sim.cluster import Cluster
from sim.runner import prepare
from sim.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
EPS_US = 0.002  # trace times are rounded to 1 ns


def _forwards(*sets, requests=80):
    scn = load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                        [f"workload.num_requests={requests}", *sets])
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
