"""Fast paths of the loop against their plain forms: ``sim.events.run_until`` (SimPy's
step inline, against the plain ``env.step()`` loop) and the sync by replica
(``SyncDiscipline.reduce_replicas``, against ``reduce`` rank by rank)."""

from __future__ import annotations

import pytest
import simpy

import sim.events as events
from conftest import ROOT
from sim.runner import run_scenario
from sim.scenario import load_scenario


def _folder(name, sets, out, plain):
    with pytest.MonkeyPatch.context() as m:
        m.setattr(events, "PLAIN_STEPS", plain)
        run_scenario(load_scenario(ROOT / "scenarios" / f"{name}.yaml", sets), out)
    return {p.name: p.read_bytes() for p in out.iterdir()}


@pytest.mark.parametrize("name,sets", [
    ("quickstart", ["workload.num_requests=150"]),
    ("jitter_ack_local", ["limits.max_requests=80", "engine.replicas=eager"]),
    ("storage_mooncake", ["workload.num_requests=80"]),
])
def test_the_inline_loop_writes_what_the_plain_loop_writes(name, sets, tmp_path):
    fast = _folder(name, sets, tmp_path / "fast", False)
    plain = _folder(name, sets, tmp_path / "plain", True)
    assert fast.keys() == plain.keys()
    for f in fast:
        assert fast[f] == plain[f], f


def _trace(plain):
    """Who ran when: three processes, simultaneous timeouts, a condition, and a
    timer that outlives the work (left unprocessed, the clock stays at the end)."""
    env = simpy.Environment()
    seen = []

    def worker(i):
        for k in range(3):
            yield env.timeout(0.5 * (i % 2) + 1.0)
            seen.append((env.now, i, k))

    procs = [env.process(worker(i)) for i in range(3)]
    over = simpy.AllOf(env, procs)
    env.timeout(100.0)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(events, "PLAIN_STEPS", plain)
        events.run_until(env, over)
    return seen, env.now, over.triggered


def test_the_inline_loop_processes_events_in_simpys_order():
    assert _trace(False) == _trace(True)
    seen, now, over = _trace(False)
    assert over and now == 4.5 and len(seen) == 9


@pytest.mark.parametrize("plain", [False, True])
def test_an_undefused_failure_crashes_the_run_as_simpy_does(plain):
    env = simpy.Environment()

    def boom():
        yield env.timeout(1)
        raise ValueError("bad")

    env.process(boom())
    with pytest.MonkeyPatch.context() as m:
        m.setattr(events, "PLAIN_STEPS", plain)
        with pytest.raises(ValueError, match="bad") as err:
            events.run_until(env, env.event())
    assert isinstance(err.value.__cause__, ValueError) and env.now == 1


@pytest.mark.parametrize("name,sets", [
    ("jitter_ack_local", ["limits.max_requests=80", "engine.replicas=eager"]),
    ("jitter_ack_local", ["limits.max_requests=80", "tp=8", "jitter.ack_delay.ranks=[1,3,5,7]"]),
    ("jitter_ack_delay", ["limits.max_requests=80", "engine.replicas=eager"]),
])
def test_the_sync_by_replica_writes_what_the_sync_by_rank_writes(name, sets, tmp_path):
    from sim.policies import sync

    def folder(out, by_replica):
        with pytest.MonkeyPatch.context() as m:
            for d in sync.SYNC_DISCIPLINES.values():
                m.setattr(type(d), "by_replica", by_replica and type(d).by_replica)
            run_scenario(load_scenario(ROOT / "scenarios" / f"{name}.yaml", sets), out)
        return {p.name: p.read_bytes() for p in out.iterdir()}

    fast, plain = folder(tmp_path / "fast", True), folder(tmp_path / "plain", False)
    assert fast.keys() == plain.keys()
    for f in fast:
        assert fast[f] == plain[f], f
