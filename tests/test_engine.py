"""The engine: replicas stay identical without jitter, sharing trees is invisible,
each jitter class has an observed outcome, and time is spent on resources."""

import json

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import Phase, given, settings

from conftest import ROOT
from sim.config import JitterConfig, SimConfig
from sim.costs import CostModel
from sim.events import Simulation
from sim.jitter import Jitter
from sim.runner import run_scenario
from sim.scenario import load_scenario
from sim.workloads.base import Request

JITTER_SCENARIOS = sorted(p.stem for p in (ROOT / "scenarios").glob("jitter_*.yaml"))


def chat_stream(n, seed, sessions=8, block=16, rate=20.0):
    """Small multi-turn stream: sessions grow their context turn by turn."""
    rng = np.random.default_rng(seed)
    ctx, nid, t = {}, 0, 0.0
    for rid in range(n):
        t += float(rng.exponential(1 / rate))
        s = int(rng.integers(sessions))
        add = int(rng.integers(1, 5))
        blocks = ctx.get(s, []) + list(range(nid, nid + add))
        nid += add
        ctx[s] = blocks
        yield Request(rid, t, tuple(blocks), block, len(blocks) * block - 3,
                      int(rng.integers(1, 40)), s)


def simulate(cfg, n=120, seed=0, **kw):
    sim = Simulation(cfg, chat_stream(n, seed, **kw))
    sim.run()
    return sim


def run_shipped(name, *sets, out=None):
    scn = load_scenario(ROOT / "scenarios" / f"{name}.yaml", list(sets))
    return run_scenario(scn, out)


# ------------------------------------------------------------------ replicas
@settings(max_examples=20, deadline=None)
@given(tp=st.integers(2, 4), seed=st.integers(0, 10_000),
       policy=st.sampled_from(["write_back", "write_through"]),
       host_policy=st.sampled_from(["duplicate_first", "lru", "duplicate_first_single_pass"]),
       page=st.sampled_from([1, 4, 16]), dev_pages=st.integers(40, 200),
       host_pages=st.integers(8, 200), chunk=st.sampled_from([None, 64, 256]))
def test_without_jitter_every_replica_stays_identical(tp, seed, policy, host_policy, page,
                                                      dev_pages, host_pages, chunk):
    cfg = SimConfig(tp=tp, page_size=page, device_tokens=dev_pages * 16, host_tokens=host_pages * 16,
                    write_policy=policy, host_policy=host_policy, load_back_threshold=1,
                    chunked_prefill_tokens=chunk, seed=seed, replicas="eager")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(Simulation, "coalesce_replicas", False)  # keep every rank's tree apart
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
    assert sim.finished and sim.metrics.done + sim.metrics.rejected == 120
    cfg.replicas = "shared"
    shared = simulate(cfg, seed=seed)
    assert len(shared.group.cohorts) == 1
    assert shared.metrics.rows == sim.metrics.rows
    assert shared.report() == rep
    # the ranks' identical trees merge back into one at the first iteration
    cfg.replicas = "eager"
    merged = simulate(cfg, seed=seed)
    assert len(merged.group.cohorts) == 1 and len(merged.group.merges) == tp - 1
    assert merged.metrics.rows == sim.metrics.rows
    assert merged.report() == rep


# No shrinking: a failing (scenario, seed) is already minimal enough to debug.
@settings(max_examples=14, deadline=None, phases=[Phase.explicit, Phase.generate])
@given(name=st.sampled_from(JITTER_SCENARIOS), seed=st.integers(0, 2**20))
def test_shared_and_eager_replicas_write_byte_identical_results(name, seed, tmp_path_factory):
    """Copy-on-divergence is bookkeeping: every jitter class, any seed."""
    sets = ["limits.max_requests=80", f"seed={seed}"]
    folders = []
    for mode in ("shared", "eager"):
        out = tmp_path_factory.mktemp(mode) / "r"
        run_shipped(name, *sets, f"engine.replicas={mode}", out=out)
        folders.append(out)
    a, b = folders
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for f in names:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


# ------------------------------------------------------------------ draws
def test_jitter_draws_are_keyed_by_rank_and_event():
    cfg = JitterConfig(ack_delay="lognormal", ack_delay_params={"mean": 1e-3, "cv": 0.5})
    a, b = Jitter(cfg, 4, seed=7), Jitter(cfg, 4, seed=7)
    first = [a.ack_delays("load", n) for n in range(50)]
    # drawing in another order, or for other kinds in between, changes nothing
    for n in reversed(range(50)):
        b.ack_delays("write", n)
        assert b.ack_delays("load", n) == first[n]
    assert Jitter(cfg, 4, seed=8).ack_delays("load", 0) != first[0]


@pytest.mark.parametrize("dist,params", [("lognormal", {"cv": 1.0}), ("exponential", {}),
                                         ("uniform", None)])
def test_ack_delay_distributions_honour_their_parameters(dist, params):
    means = []
    for mean in (1e-4, 5e-2):
        p = {"low": 0.0, "high": 2 * mean} if params is None else {"mean": mean, **params}
        j = Jitter(JitterConfig(ack_delay=dist, ack_delay_params=p), 2, seed=1)
        draws = [d for n in range(4000) for d in j.ack_delays("load", n).values()]
        means.append(np.mean(draws))
        assert np.mean(draws) == pytest.approx(mean, rel=0.08)
    assert means[1] > 100 * means[0]


# ------------------------------------------------------------------ verdicts
def test_perturbations_that_never_fire_give_agree():
    # id drift after a request that never arrives
    cfg = SimConfig(tp=2, page_size=16, device_tokens=16 * 60, host_tokens=16 * 60,
                    jitter=JitterConfig(id_drift_rank=1, id_drift_extra=3, id_drift_after=10**9))
    rep = simulate(cfg).report()
    assert rep["verdict"] == "agree" and rep["perturbations"] == {"id_drift": 0}
    # a write-ack delay under write_back, where no write ack exists
    cfg = SimConfig(tp=2, page_size=16, device_tokens=16 * 60, host_tokens=16 * 60,
                    jitter=JitterConfig(ack_delay="exponential", ack_delay_params={"mean": 1e-3},
                                        ack_delay_acks="write"))
    rep = simulate(cfg).report()
    assert rep["verdict"] == "agree" and rep["perturbations"] == {"ack_delay": 0}
    # the local discipline with no delays: every rank pops the same acks
    cfg = SimConfig(tp=2, page_size=16, device_tokens=16 * 60, host_tokens=16 * 60,
                    discipline="local", load_back_threshold=1)
    rep = simulate(cfg).report()
    assert rep["verdict"] == "agree" and "no perturbation fired" in rep["reason"]


def test_ack_delay_is_absorbed_by_synced_acks():
    d = run_shipped("jitter_ack_delay").divergence
    assert d["verdict"] == "absorbed" and d["perturbations"]["ack_delay"] > 0
    assert "ack_delay fired" in d["reason"]
    assert d["digest_mismatch"] is None and d["first_true_divergence"] is None


def test_local_ack_drain_diverges_and_the_digest_detects_it():
    d = run_shipped("jitter_ack_local").divergence
    assert d["verdict"] == "detected"
    assert d["first_true_divergence"]["t"] <= d["digest_mismatch"]["t"]
    assert d["detection_delay_s"] == pytest.approx(d["digest_mismatch"]["t"]
                                                   - d["first_true_divergence"]["t"])


def test_id_drift_is_a_false_alarm():
    d = run_shipped("jitter_id_drift").divergence
    assert d["verdict"] == "false_alarm" and d["halted"] == "digest_mismatch"
    assert d["first_true_divergence"] is None  # the trees are logically equal
    assert d["perturbations"] == {"id_drift": 1}
    assert len(set(d["digests"].values())) == 2


def test_pre_26921_write_check_hangs_where_0523_does_not():
    """sglang #26921 / #28429: a rank-local write_through backup failure empties one
    rank's in-flight writes; the pre-fix early return then skips the collective."""
    old = run_shipped("jitter_pre_26921").divergence
    assert old["verdict"] == "hang" and old["collective_error"]["site"] == "write_check"
    assert old["perturbations"]["host_alloc_failure"] >= 1
    assert old["collective_error"]["ranks_out"] == [1]
    new = run_shipped("jitter_pre_26921", "collective.discipline=synced").divergence
    assert new["verdict"] != "hang" or new["collective_error"]["site"] != "write_check"


def test_pre_26921_does_not_hang_while_every_rank_has_acks_in_flight():
    """Late acks alone never empty one rank's queue before another's: no false hang."""
    cfg = SimConfig(tp=2, page_size=16, device_tokens=16 * 60, host_tokens=16 * 200,
                    discipline="pre_26921", write_policy="write_through", load_back_threshold=1,
                    jitter=JitterConfig(ack_delay="uniform", ack_delay_params={"low": 0, "high": 5e-3},
                                        ack_delay_ranks=(1,)))
    rep = simulate(cfg, n=200).report()
    assert rep["verdict"] == "absorbed" and rep["collective_error"] is None


def test_sync_disciplines_resolve_by_name_through_their_registry(monkeypatch):
    """The engine runs whichever discipline the registry holds under the configured
    name (the schema offers exactly the registry's names); an unknown name is a
    one-line error listing them."""
    import typing

    from sim.errors import UserError
    from sim.policies import sync
    from sim.scenario import Collective

    names = typing.get_args(Collective.model_fields["discipline"].annotation)
    assert names == tuple(sync.SYNC_DISCIPLINES) == ("synced", "pre_26921", "local")
    reduced = []

    class Spy(sync.Synced):
        __slots__ = ()

        def reduce(self, sim, counts, digest):
            reduced.append(dict(counts))
            super().reduce(sim, counts, digest)

        def reduce_replicas(self, sim, rows):
            reduced.append({r: (w, l_) for c, w, l_, _ in rows for r in c.ranks})
            super().reduce_replicas(sim, rows)

    monkeypatch.setitem(sync.SYNC_DISCIPLINES, "spy", Spy())
    base = dict(tp=2, page_size=16, device_tokens=16 * 60, host_tokens=16 * 200,
                load_back_threshold=1, replicas="eager")
    spy = simulate(SimConfig(discipline="spy", **base))
    ref = simulate(SimConfig(discipline="synced", **base))
    assert reduced and spy.metrics.rows == ref.metrics.rows
    with pytest.raises(UserError, match="unknown sync discipline 'nope'; expected one of: "
                                        "local, pre_26921, spy, synced"):
        Simulation(SimConfig(discipline="nope", **base), [])


@pytest.mark.parametrize("name,verdict", [
    # late device frees make rank 1 evict where rank 0 does not; the evictions reach
    # duplicate reclaim, and the digest fires first (the scenario's comment: 22.2 s)
    ("jitter_device_free_delay", "detected"),
    # a smaller device pool on rank 1: the same path, the digest fires at 12.8 s
    ("jitter_device_capacity_skew", "detected"),
    # a failed write_through backup on one rank changes no reclaim victim, so the
    # digest stays silent; rank 1 admits another batch and rank 0 waits in the
    # forward's all_reduce until the collective times out (the scenario's comment)
    ("jitter_write_through_alloc_failure", "hang"),
])
def test_rank_local_device_state_fails_where_sglang_would(name, verdict):
    """Rank-local allocator state changes what a rank caches; the outcome (digest,
    forward shapes) is whatever the ranks' own checks see first."""
    d = run_shipped(name).divergence
    assert d["verdict"] == verdict
    assert d["first_true_divergence"] is not None
    if d["verdict"] in ("size_mismatch", "hang"):
        err = d["collective_error"]
        assert err["site"] == "forward" and d["shape_divergence"]["step"] <= err["step"]
    if d["verdict"] == "hang":
        # a rank with no batch runs no forward: it blocks in the request broadcast
        idle = [r for r, c in d["collective_error"]["pending"].items()
                if c["site"] == "request_broadcast"]
        assert idle and [int(r) for r in idle] == d["collective_error"]["ranks_out"]


def test_skew_counters_fire_only_on_the_skewed_replica():
    """A capacity skew counts where it changed what the skewed rank did, never on the
    unskewed rank (so absorbed versus agree is observed)."""
    from sim.request import _Plan
    from sim.scheduler import available
    from sim.tree import Tree
    cfg = SimConfig(tp=2, page_size=16, device_tokens=16 * 80, host_tokens=16 * 200,
                    jitter=JitterConfig(device_capacity_skew={1: -16 * 4},
                                        host_capacity_skew={1: -16 * 10}))
    sim = simulate(cfg, n=150)
    fired = sim.jitter.perturbations.fired
    by_rank = {c.ranks[0]: c for c in sim.group.cohorts}
    c0, c1 = by_rank[0], by_rank[1]
    assert c0.ranks == [0] and c1.ranks == [1] and c0.tree.evictable and c1.tree.evictable
    before = fired["device_capacity_skew"]
    free0 = available(c0.tree)
    sim._evict_for(c0, free0 + 16, _Plan())  # the unskewed rank evicts: no count
    assert fired["device_capacity_skew"] == before
    free1 = available(c1.tree)
    sim._evict_for(c1, free1 + 16, _Plan())  # needed only because its pool is smaller
    assert fired["device_capacity_skew"] == before + 1
    # host: only the skewed rank's tree carries the hook, with its unskewed capacity
    t0, t1 = c0.tree, c1.tree
    assert t0.host_skew_fired is None and t0.host_nominal is None
    assert t1.host_nominal == cfg.host_tokens and t1.host_capacity == cfg.host_tokens - 160
    # the hook's rule: a backup's room check calls it only where the skewed pool
    # evicts on the host where the unskewed one would not (or a different amount)
    calls = []
    t = Tree(device_capacity=32, host_capacity=4)
    t.host_nominal, t.host_skew_fired = 8, lambda: calls.append(1)
    t.insert([1, 2])
    assert t.backup_node(t.match_prefix([1, 2]).best).ok and calls == []  # fits both
    t.insert([3, 4, 5])
    assert t.backup_node(t.match_prefix([3, 4, 5]).best).ok  # 2 free here, 6 unskewed
    assert calls == [1] and t.stats.reclaims == 1


def test_forward_shapes_that_differ_are_a_size_mismatch():
    # rank 1's device pool is much smaller: it evicts where rank 0 hits
    cfg = SimConfig(tp=2, page_size=16, device_tokens=16 * 80, host_tokens=0,
                    write_policy="write_through", jitter=JitterConfig(device_capacity_skew={1: -16 * 30}))
    sim = simulate(cfg, n=300)
    rep = sim.report()
    assert rep["verdict"] == "size_mismatch"
    assert rep["collective_error"]["site"] == "forward"
    assert rep["shape_divergence"]["t"] <= rep["collective_error"]["t"]
    assert rep["shape_divergence"]["first_request"] is not None


# ------------------------------------------------------------------ time
def test_each_request_carries_its_own_backup_stall():
    cfg = SimConfig(tp=1, page_size=16, device_tokens=16 * 40, host_tokens=16 * 400, load_back_threshold=1)
    sim = simulate(cfg, n=150)
    stalls = [r[13] for r in sim.metrics.rows]
    assert sum(stalls) > 0 and len(set(stalls)) > 2  # not one batch value copied around
    assert sim.metrics.summary(sim.group.cohorts[0].tree)["backup_stall_s"] == pytest.approx(sum(stalls))
    cfg.write_policy = "write_through"
    wt = simulate(cfg, n=150)
    assert sum(r[13] for r in wt.metrics.rows) == 0  # no blocking backups under write_through


def test_chunked_prefill_changes_the_run():
    runs = {}
    for chunk in (None, 32):
        cfg = SimConfig(tp=1, page_size=16, device_tokens=16 * 400, host_tokens=16 * 400,
                        chunked_prefill_tokens=chunk)
        sim = simulate(cfg, n=60)
        runs[chunk] = sim
    a, b = runs[None], runs[32]
    assert a.step_no < b.step_no  # more prefill forwards
    assert [r[4] for r in a.metrics.rows] != [r[4] for r in b.metrics.rows]  # first tokens move


def test_decode_steps_share_the_gpu():
    """A request decodes slower when more requests share its decode steps: with the
    roofline cost model every step reads each sequence's KV, so the same 100 decode
    tokens take strictly longer in a batch of 2, 4, 8 (FixedCosts' flat step is the
    control: batching changes nothing there)."""
    def decode_span(n, cost):
        cfg = SimConfig(tp=1, page_size=16, device_tokens=16 * 4000, host_tokens=0)
        reqs = [Request(i, 0.0, tuple(range(10 * i, 10 * i + 4)), 16, 60, 100, i) for i in range(n)]
        sim = Simulation(cfg, reqs, cost)
        sim.run()
        assert sim.metrics.done == n
        return max(r[5] - r[4] for r in sim.metrics.rows)  # finish - first token
    roofline = CostModel("h200-sxm", "llama-3.1-8b", tp=1, page_size=16)
    spans = [decode_span(n, roofline) for n in (1, 2, 4, 8)]
    assert spans == sorted(spans) and len(set(spans)) == 4, spans
    # 99 steps after the first token, each at least one batch-of-one step
    assert spans[0] >= 99 * roofline.decode_step_time(1, 64)
    assert decode_span(1, None) == pytest.approx(decode_span(8, None)) == pytest.approx(99 * 10e-3)


@pytest.mark.parametrize("now,t", [(0.010114213761294236, 0.05929661156129424),
                                   (0.07134028936993596, 0.24086585731993596),
                                   (0.0, 0.3), (1.5, 1.5), (2.0 / 3.0, 7.1)])
def test_a_wait_until_lands_on_its_time_bit_for_bit(now, t):
    """A decode run's end is a step boundary computed in floats; its wait must end on
    exactly that value, also where no delay added to ``now`` gives it (the first two:
    rounding to even skips ``t``), as a step-by-step loop would reach it."""
    import simpy

    from sim.events import until

    env = simpy.Environment(initial_time=now)
    seen = []

    def proc():
        yield from until(env, t)
        seen.append(env.now)

    env.process(proc())
    env.run()
    assert seen == [t]


def test_load_backs_queue_on_the_copy_engine():
    """Loads of consecutive batches share one H2D engine: FIFO, never overlapping."""
    cfg = SimConfig(tp=1, page_size=16, device_tokens=16 * 30, host_tokens=16 * 400,
                    load_back_threshold=1)
    trace = []
    sim = Simulation(cfg, chat_stream(200, 3), trace_events=trace)
    sim.run()
    copies = sorted((e["ts"], e["ts"] + e["dur"]) for e in trace if e["name"] == "load_copy")
    assert len(copies) > 5
    for (s0, e0), (s1, _) in zip(copies, copies[1:]):
        assert s1 >= e0 - 1e-6


def test_outcomes_are_deterministic():
    a = run_shipped("jitter_ack_local")
    b = run_shipped("jitter_ack_local")
    assert json.dumps(a.divergence, sort_keys=True) == json.dumps(b.divergence, sort_keys=True)
    assert a.summary == b.summary


# ------------------------------------------------------------------ op-traces
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


# ------------------------------------------------------------------ real collectives
def test_gloo_collective_agrees_exactly_with_simulated(tmp_path):
    sets = ["tp=2", "workload.num_requests=30"]
    scn = load_scenario(ROOT / "scenarios" / "quickstart.yaml", sets)
    sim_res = run_scenario(scn, tmp_path / "sim")
    torch_res = run_scenario(scn, tmp_path / "torch", collective="torch")
    assert sim_res.divergence["collective_calls"] == torch_res.divergence["collective_calls"] > 0
    for f in ("requests.parquet", "timeseries.parquet", "divergence.json", "summary.json"):
        assert (tmp_path / "sim" / f).read_bytes() == (tmp_path / "torch" / f).read_bytes(), f


def test_gloo_really_blocks_where_the_pre_26921_code_skips_a_collective():
    """A rank that returns early from writing_check leaves its peer blocked in a real
    gloo all_reduce; the timeout reports the hang at the same step as simulated."""
    scn = load_scenario(ROOT / "scenarios" / "jitter_pre_26921.yaml", ["collective.timeout_s=2"])
    a = run_scenario(scn, None).divergence
    b = run_scenario(scn, None, collective="torch").divergence
    assert a["verdict"] == b["verdict"] == "hang"
    ea, eb = a["collective_error"], b["collective_error"]
    assert (ea["step"], ea["site"], ea["ranks_in"], ea["ranks_out"]) == \
        (eb["step"], eb["site"], eb["ranks_in"], eb["ranks_out"])
    # the line a server with this timeout dies with, and what gloo printed here
    assert "Timed out waiting 2000ms" in ea["message"] and "Timed out waiting 2000ms" in eb["message"]


def test_a_replicas_shared_ready_count_reads_only_the_acks_that_decide_it():
    from collections import deque

    import simpy

    from sim.ranks import Ack, Cohort

    env = simpy.Environment()
    c = Cohort(env, [0, 1], tree=None)

    def ack(done, delays=None):
        a = Ack("write", [1], 64, 0, delays)
        a.done = done
        if delays:
            a.late = {r: env.event() for r in delays}  # not yet fired
        return a

    ready, pending, delayed = ack(0.0), ack(None), ack(0.0, {1: 1e-3})
    assert c.shared_ready_count(deque(), 0.0) == 0
    assert c.shared_ready_count(deque([ready, ready, pending]), 0.0) == 2
    # a delayed ack behind the first pending one decides nothing
    assert c.shared_ready_count(deque([ready, pending, delayed]), 0.0) == 1
    # one among the acks that decide it: each rank counts for itself
    q = deque([ready, delayed, ready])
    assert c.shared_ready_count(q, 0.0) is None
    assert [c.ready_count(q, r, 0.0) for r in (0, 1)] == [3, 1]
