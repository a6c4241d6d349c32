"""Data-parallel instances behind a router: routing, per-instance reports, load."""

import numpy as np
import pytest

from conftest import ROOT
from sim.cluster import Cluster
from sim.config import JitterConfig, SimConfig
from sim.events import Simulation
from sim.jitter import Jitter
from sim.router import CacheAware, LeastLoad, RoundRobin
from sim.runner import run_scenario
from sim.scenario import load_scenario
from sim.workloads.base import Request
from test_engine import chat_stream


def cluster(cfg, n=200, seed=0, rate=20.0, sessions=8):
    c = Cluster(cfg, chat_stream(n, seed, sessions=sessions, rate=rate))
    c.run()
    return c


def test_one_instance_is_the_plain_tp_group():
    cfg = SimConfig(tp=2, page_size=16, device_tokens=16 * 80, host_tokens=16 * 80, load_back_threshold=1)
    c = cluster(cfg)
    s = Simulation(cfg, chat_stream(200, 0))
    s.run()
    assert c.instances[0].metrics.rows == s.metrics.rows
    assert c.report() == s.report()


def test_round_robin_and_least_load_spread_requests():
    base = dict(tp=1, page_size=16, device_tokens=16 * 200, host_tokens=16 * 200, dp=4)
    rr = cluster(SimConfig(**base, router="round_robin"))
    assert rr.routed == [50, 50, 50, 50]
    ll = cluster(SimConfig(**base, router="least_load"), rate=200.0)
    assert sum(ll.routed) == 200 and min(ll.routed) > 0
    # every request finished on the instance it was routed to
    assert [i.metrics.done for i in ll.instances] == ll.routed


def test_cache_aware_routing_keeps_sessions_together_and_hits_more():
    params = {"cache_threshold": 0.3, "balance_abs_threshold": 64,
              "balance_rel_threshold": 1.5, "max_tree_tokens": 1 << 24}
    base = dict(tp=1, page_size=16, device_tokens=16 * 120, host_tokens=0, dp=4)
    rr = cluster(SimConfig(**base, router="round_robin"), n=400, sessions=16)
    ca = cluster(SimConfig(**base, router="cache_aware", router_params=params), n=400, sessions=16)
    assert ca.hit_rate > rr.hit_rate + 0.05
    assert ca.router.cache_routes > 0


def test_cache_aware_balances_when_loads_are_imbalanced():
    r = CacheAware(3, cache_threshold=0.3, balance_abs_threshold=2, balance_rel_threshold=1.5,
                   max_tree_tokens=1 << 20)
    req = Request(0, 0.0, (1, 2, 3), 16, 48, 4, 0)
    r.routed(req, 0)
    assert r.choose(req, [1, 1, 1]) == 0            # balanced: the cached instance
    assert r.choose(req, [9, 1, 5]) == 1            # imbalanced: the least loaded
    other = Request(1, 0.0, (7, 8), 16, 32, 4, 0)
    assert r.choose(other, [1, 1, 1]) == 1          # no match: the smallest tree
    assert r.stats() == {"load_balanced": 1, "cache_hit": 1, "most_room": 1}


def test_cache_aware_trees_are_trimmed_to_their_size():
    r = CacheAware(1, cache_threshold=0.3, balance_abs_threshold=2, balance_rel_threshold=1.5,
                   max_tree_tokens=16 * 4)
    r.routed(Request(0, 0.0, tuple(range(10)), 16, 160, 1, 0), 0)
    assert list(r.trees[0]) == [6, 7, 8, 9]  # least recently routed blocks go first


def test_simple_routers_are_deterministic():
    req = Request(0, 0.0, (1,), 16, 16, 1, 0)
    rr = RoundRobin(3)
    assert [rr.choose(req, [0, 0, 0]) for _ in range(5)] == [0, 1, 2, 0, 1]
    assert LeastLoad(3).choose(req, [2, 1, 1]) == 1  # ties: the lowest index


def test_router_thresholds_need_the_cache_aware_policy(tmp_path):
    from sim.errors import UserError

    with pytest.raises(UserError) as err:
        load_scenario(ROOT / "scenarios" / "quickstart.yaml", ["dp=2", "router.cache_threshold=0.5"])
    assert "router.cache_threshold" in str(err.value) and "cache_aware" in str(err.value)
    scn = load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                        ["dp=2", "router.policy=cache_aware", "router.cache_threshold=0.5"])
    assert scn.router.params()["cache_threshold"] == 0.5


def test_instances_draw_their_own_jitter():
    cfg = JitterConfig(ack_delay="exponential", ack_delay_params={"mean": 1e-3})
    a, b = Jitter(cfg, 2, seed=3, rank_base=0), Jitter(cfg, 2, seed=3, rank_base=2)
    assert a.ack_delays("load", 0) != b.ack_delays("load", 0)


def test_a_failing_instance_is_reported_with_every_instance():
    cfg = SimConfig(tp=2, dp=2, page_size=16, device_tokens=16 * 80, host_tokens=16 * 200,
                    write_policy="write_through", discipline="pre_26921", load_back_threshold=1,
                    jitter=JitterConfig(host_alloc_failure_p=0.2, host_alloc_failure_ranks=(1,)))
    c = cluster(cfg, n=300)
    rep = c.report()
    assert rep["verdict"] == "hang" and len(rep["instances"]) == 2
    assert rep["instances"][rep["instance"]]["verdict"] == "hang"
    assert c.halted == "hang"


def test_time_series_have_a_row_per_instance_and_rank(tmp_path):
    scn = load_scenario(ROOT / "scenarios" / "quickstart.yaml",
                        ["dp=2", "tp=2", "limits.max_requests=40"])
    res = run_scenario(scn, tmp_path / "r")
    ts = res.sim.timeseries_df()
    assert set(ts["instance"]) == {0, 1} and set(ts["rank"]) == {0, 1}
    counts = ts.groupby(["t", "instance"]).size()
    assert set(counts) == {2}  # both ranks at every sample
    req = res.sim.requests_df()
    assert set(req["instance"]) == {0, 1}
    s = res.summary
    assert [i["routed"] for i in s["instances"]] == [20, 20]
    assert all(0 < i["utilisation"] <= 1 for i in s["instances"])


def test_overload_is_observed_not_assumed():
    cfg = dict(tp=1, page_size=16, device_tokens=16 * 40, host_tokens=0)
    light = cluster(SimConfig(**cfg), n=100, rate=0.5).summary()
    heavy = cluster(SimConfig(**cfg), n=100, rate=500.0).summary()
    assert light["overload_warning"] is None
    assert heavy["overload_warning"] is not None and "queue" in heavy["overload_warning"]
    assert heavy["queue_wait_p50_s"] > light["queue_wait_p50_s"]
    assert np.isfinite(heavy["utilisation"])
