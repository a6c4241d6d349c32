"""The engine: replicas stay identical without jitter; each jitter class has a pinned
outcome; gloo-backed runs agree exactly with simulated ones."""

import json

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from conftest import ROOT
from sim.collectives import CollectiveError, SimulatedCollective
from sim.config import JitterConfig, SimConfig
from sim.events import Simulation
from sim.runner import run_scenario
from sim.scenario import load_scenario
from sim.workloads.base import Request


def chat_stream(n, seed, sessions=8, block=16):
    """Small multi-turn stream: sessions grow their context turn by turn."""
    rng = np.random.default_rng(seed)
    ctx, nid, t = {}, 0, 0.0
    for rid in range(n):
        t += float(rng.exponential(0.05))
        s = int(rng.integers(sessions))
        add = int(rng.integers(1, 5))
        blocks = ctx.get(s, []) + list(range(nid, nid + add))
        nid += add
        ctx[s] = blocks
        yield Request(rid, t, tuple(blocks), block, len(blocks) * block - 3,
                      int(rng.integers(1, 40)), s)


def simulate(cfg, n=120, seed=0):
    sim = Simulation(cfg, chat_stream(n, seed))
    sim.run()
    return sim


@settings(max_examples=25, deadline=None)
@given(tp=st.integers(2, 4), seed=st.integers(0, 10_000),
       policy=st.sampled_from(["write_back", "write_through"]),
       host_policy=st.sampled_from(["duplicate_first", "lru", "duplicate_first_single_pass"]),
       page=st.sampled_from([1, 4, 16]), dev_pages=st.integers(40, 200),
       host_pages=st.integers(8, 200))
def test_without_jitter_every_replica_stays_identical(tp, seed, policy, host_policy, page,
                                                      dev_pages, host_pages):
    cfg = SimConfig(tp=tp, page_size=page, device_tokens=dev_pages * 16, host_tokens=host_pages * 16,
                    write_policy=policy, host_policy=host_policy, load_back_threshold=1,
                    seed=seed, eager_replicas=True)
    sim = simulate(cfg, seed=seed)
    trees = [c.tree for c in sim.group.cohorts]
    assert len(trees) == tp  # every rank really ran its own tree
    for t in trees:
        t.check()
        assert t.fingerprint() == trees[0].fingerprint()
        assert t.digest == trees[0].digest
        assert t.stats.as_dict() == trees[0].stats.as_dict()
    rep = sim.report()
    assert rep["verdict"] == "agree" and rep["digest_mismatch"] is None
    # copy-on-divergence is invisible: one shared replica gives the same run
    cfg.eager_replicas = False
    shared = simulate(cfg, seed=seed)
    assert len(shared.group.cohorts) == 1
    assert shared.metrics.rows == sim.metrics.rows
    assert shared.group.cohorts[0].tree.digest == trees[0].digest


def run_shipped(name, *sets):
    scn = load_scenario(ROOT / "scenarios" / f"{name}.yaml", list(sets))
    return run_scenario(scn, None)


def test_ack_delay_is_absorbed_by_synced_acks():
    res = run_shipped("jitter_ack_delay")
    d = res.divergence
    assert d["verdict"] == "absorbed" and d["jitter"]
    assert d["digest_mismatch"] is None and d["first_true_divergence"] is None
    assert len(d["cohorts"]) == 1  # synced counts never fork a rank


def test_local_ack_drain_diverges_and_the_digest_detects_it():
    d = run_shipped("jitter_ack_local").divergence
    assert d["verdict"] == "detected"
    assert d["forks"][0]["cause"] == "ack_local_drain"
    assert d["first_true_divergence"]["t"] <= d["digest_mismatch"]["t"]
    assert d["detection_delay_s"] >= 0


def test_skip_when_idle_hangs_the_sync_collective():
    d = run_shipped("jitter_skip_when_idle").divergence
    assert d["verdict"] == "hang" and d["halted"] == "hang"
    assert "skipped it" in d["collective_error"]["message"]


def test_id_drift_is_a_false_alarm():
    d = run_shipped("jitter_id_drift").divergence
    assert d["verdict"] == "false_alarm" and d["halted"] == "digest_mismatch"
    assert d["first_true_divergence"] is None  # the trees are logically equal
    assert d["forks"][0]["cause"] == "id_drift"
    digests = set(d["digests"].values())
    assert len(digests) == 2


@pytest.mark.parametrize("name,cause", [("jitter_host_alloc_failure", "host_alloc_failure"),
                                        ("jitter_host_capacity_skew", "host_capacity_skew")])
def test_rank_local_host_state_diverges_and_the_digest_catches_it_later(name, cause):
    d = run_shipped(name).divergence
    assert d["forks"][0]["cause"] == cause
    assert d["verdict"] == "detected"
    true_t, digest_t = d["first_true_divergence"]["t"], d["digest_mismatch"]["t"]
    assert true_t < digest_t and d["detection_delay_s"] == pytest.approx(digest_t - true_t)
    # recorded past the assertion, the ranks' scheduling then disagrees too
    assert d["batch_mismatch"] is None or d["batch_mismatch"]["t"] >= digest_t


def test_request_order_changes_the_batches_before_any_reclaim_differs():
    d = run_shipped("jitter_request_order").divergence
    assert d["forks"][0]["cause"] == "request_order"
    assert d["verdict"] == "hang" and d["digest_mismatch"] is None
    assert d["first_true_divergence"]["t"] <= d["batch_mismatch"]["t"]


def test_outcomes_are_deterministic():
    a = run_shipped("jitter_ack_local")
    b = run_shipped("jitter_ack_local")
    assert json.dumps(a.divergence, sort_keys=True) == json.dumps(b.divergence, sort_keys=True)
    assert a.summary == b.summary


def test_call_log_reports_hangs_and_size_mismatches():
    coll = SimulatedCollective(3)
    assert coll.all_reduce_min("x", {0: [3, -3], 1: [1, -1], 2: [2, -2]}) == [1, -3]
    with pytest.raises(CollectiveError) as err:
        coll.all_reduce_min("x", {0: [1], 2: [1]})
    assert err.value.kind == "hang" and "[1] skipped" in str(err.value)
    with pytest.raises(CollectiveError) as err:
        coll.all_reduce_min("x", {0: [1, 2], 1: [1], 2: [1, 2]})
    assert err.value.kind == "size_mismatch"


def test_write_back_eviction_charges_blocking_backups():
    cfg = SimConfig(tp=1, page_size=16, device_tokens=16 * 40, host_tokens=16 * 400, load_back_threshold=1)
    sim = simulate(cfg, n=150)
    stats = sim.group.cohorts[0].tree.stats
    assert stats.backups > 0
    assert sum(r[13] for r in sim.metrics.rows) > 0  # backup_stall_s on the critical path
    cfg.write_policy = "write_through"
    wt = simulate(cfg, n=150)
    assert wt.group.cohorts[0].tree.digest == 0


@pytest.mark.parametrize("tp", [2, 4])
def test_gloo_collective_agrees_exactly_with_simulated(tp, tmp_path):
    sets = [f"tp={tp}", "workload.num_requests=40"]
    scn = load_scenario(ROOT / "scenarios" / "quickstart.yaml", sets)
    sim_res = run_scenario(scn, tmp_path / "sim")
    torch_res = run_scenario(scn, tmp_path / "torch", collective="torch")
    assert sim_res.summary == torch_res.summary
    assert sim_res.divergence["collective_calls"] == torch_res.divergence["collective_calls"] > 0
    for f in ("requests.parquet", "timeseries.parquet", "divergence.json", "summary.json"):
        assert (tmp_path / "sim" / f).read_bytes() == (tmp_path / "torch" / f).read_bytes()


def test_gloo_collective_reports_the_same_hang():
    scn = load_scenario(ROOT / "scenarios" / "jitter_skip_when_idle.yaml", [])
    a = run_scenario(scn, None).divergence
    b = run_scenario(scn, None, collective="torch").divergence
    assert a["verdict"] == b["verdict"] == "hang"
    assert a["collective_error"] == b["collective_error"]


@pytest.mark.parametrize("page", [1, 16])
def test_recorded_replica_op_traces_replay_exactly(page):
    """Each replica's op-trace, replayed by replay-ops, reaches the engine's exact tree:
    the bundle traces of `repro` can be checked against SGLang's own tree code."""
    from sim.optrace import Replayer, engine_ops_to_trace

    cfg = SimConfig(tp=2, page_size=page, device_tokens=16 * 48, host_tokens=16 * 40,
                    load_back_threshold=1, record_ops=True,
                    jitter=JitterConfig(id_drift_rank=1, id_drift_extra=2, id_drift_after=30))
    sim = simulate(cfg, n=150)
    assert len(sim.group.cohorts) == 2
    for c in sim.group.cohorts:
        ops = engine_ops_to_trace(c.ops, device_capacity=cfg.device_tokens,
                                  host_capacity=c.tree.host_capacity, page_size=page,
                                  write_policy=cfg.write_policy,
                                  load_back_threshold=cfg.load_back_threshold)
        r = Replayer(ops[0])
        outs = [r.apply(i, op) for i, op in enumerate(ops[1:], 1)]
        assert not any("error" in o for o in outs)
        t = r.tree
        assert t.digest == c.tree.digest != 0
        assert (t.dev_used, t.host_used, t.n_nodes) == (c.tree.dev_used, c.tree.host_used, c.tree.n_nodes)
        assert t.stats.as_dict() == c.tree.stats.as_dict()
        assert list(t.dups) == list(c.tree.dups)
