"""Fast paths of the loop against their plain forms: ``sim.events.run_until`` (SimPy's
step inline, against the plain ``env.step()`` loop), the sync by replica
(``SyncDiscipline.reduce_replicas``, against ``reduce`` rank by rank) and quiet
arrivals (``Simulation.quiet_arrivals``, against every arrival cutting the decode
run in flight)."""

from __future__ import annotations

import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim.events as events
from conftest import ROOT
from sim.runner import run_scenario
from sim.scenario import load_scenario


def _assert_same(fast: dict, plain: dict) -> None:
    """Two results folders, file by file, byte for byte."""
    assert fast.keys() == plain.keys()
    for f in fast:
        assert fast[f] == plain[f], f


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
    _assert_same(fast, plain)


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
    _assert_same(fast, plain)


def _quiet_folder(name, sets, out, quiet):
    """The results folder with quiet arrivals on or off, and how many relevant
    moments the run's loops saw (each a decode run cut or an idle loop woken)."""
    seen = [0]
    relevant = events.Simulation._relevant

    def counted(self, t=None):
        seen[0] += 1
        relevant(self, t)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(events.Simulation, "quiet_arrivals", quiet)
        m.setattr(events.Simulation, "_relevant", counted)
        run_scenario(load_scenario(ROOT / "scenarios" / f"{name}.yaml", sets), out)
    return {p.name: p.read_bytes() for p in out.iterdir()}, seen[0]


def _same_quiet_and_plain(name, sets, out):
    (fast, fast_seen), (plain, plain_seen) = (_quiet_folder(name, sets, out / "fast", True),
                                              _quiet_folder(name, sets, out / "plain", False))
    _assert_same(fast, plain)
    return fast_seen, plain_seen


@pytest.mark.parametrize("name,sets", [
    # memory-bound at TP 2: most arrivals find every batch full
    ("quickstart", ["workload.num_requests=400"]),
    # data-parallel: an arrival is nothing to the instances it is not routed to
    ("quickstart", ["workload.num_requests=300", "dp=3", "router.policy=least_load"]),
    # ranks apart, eager replicas: late frees; a host smaller on one rank
    ("jitter_device_free_delay", ["limits.max_requests=150", "engine.replicas=eager",
                                  "device.tokens=8192", "scheduler.max_running_requests=8"]),
    ("jitter_host_capacity_skew", ["limits.max_requests=150", "engine.replicas=eager"]),
    ("hybrid_swa", ["workload.num_requests=150", "scheduler.max_running_requests=4"]),
    ("hybrid_mamba", ["workload.num_requests=150", "scheduler.max_running_requests=4"]),
    ("quickstart", ["workload.num_requests=200", "scheduler.overlap=false"]),
])
def test_quiet_arrivals_write_what_cutting_every_run_writes(name, sets, tmp_path):
    fast_seen, plain_seen = _same_quiet_and_plain(name, sets, tmp_path)
    # the fast path was taken: fewer relevant moments, the same results
    assert fast_seen < plain_seen


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1), tp=st.sampled_from([1, 2, 4]),
       dp=st.sampled_from([1, 2]), overlap=st.booleans(),
       replicas=st.sampled_from(["shared", "eager"]))
def test_quiet_arrivals_agree_with_plain_for_any_seed(seed, tp, dp, overlap, replicas, tmp_path_factory):
    sets = [f"seed={seed}", f"tp={tp}", f"dp={dp}", f"scheduler.overlap={str(overlap).lower()}",
            f"engine.replicas={replicas}", "workload.num_requests=120",
            "workload.arrival.rate=4"]
    _same_quiet_and_plain("quickstart", sets, tmp_path_factory.mktemp("quiet"))


def _join_folder(name, sets, out, join):
    """The results folder with the steps after a memory-work step joining its run or
    not (``Decode.join_after_memory``), and how many decode iterations ran."""
    from sim.decode import Decode
    seen = [0]
    decode = Decode._decode

    def counted(self):
        seen[0] += 1
        return (yield from decode(self))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(Decode, "join_after_memory", join)
        m.setattr(Decode, "_decode", counted)
        run_scenario(load_scenario(ROOT / "scenarios" / f"{name}.yaml", sets), out)
    return {p.name: p.read_bytes() for p in out.iterdir()}, seen[0]


@pytest.mark.parametrize("name,sets", [
    # memory-bound at TP 2: a new request's first decode step often needs a page
    ("quickstart", ["workload.num_requests=300"]),
    # the speed benchmark's TP 8 run, smaller
    ("quickstart", ["workload.num_requests=300", "tp=8", "scheduler.max_running_requests=64",
                    "workload.arrival.rate=20"]),
    # serial overlap timing: the run prices its steps with decode_run
    ("quickstart", ["workload.num_requests=300", "scheduler.overlap_timing=serial"]),
    ("storage_mooncake", ["workload.num_requests=80"]),
])
def test_steps_after_memory_work_join_its_run_with_the_same_results(name, sets, tmp_path):
    (fast, fast_n), (plain, plain_n) = (_join_folder(name, sets, tmp_path / "fast", True),
                                        _join_folder(name, sets, tmp_path / "plain", False))
    _assert_same(fast, plain)
    if name == "storage_mooncake":
        assert fast_n == plain_n  # the L3 tier's staging keeps its step alone
    else:
        assert fast_n < plain_n  # the fast path was taken
