"""Identical replicas merge back (sim.coalesce): bookkeeping that never changes a
result, and a comparison that misses no difference."""

from __future__ import annotations

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from conftest import ROOT
from sim.coalesce import Iso, signature
from sim.config import SimConfig
from sim.events import Simulation
from sim.runner import run_scenario
from sim.scenario import load_scenario
from test_engine import JITTER_SCENARIOS, simulate


def _run(name, sets, out, coalesce):
    with pytest.MonkeyPatch.context() as m:
        m.setattr(Simulation, "coalesce_replicas", coalesce)
        scn = load_scenario(ROOT / "scenarios" / f"{name}.yaml", list(sets))
        return run_scenario(scn, out)


def _same_folders(a, b):
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for f in names:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


# No shrinking: a failing (scenario, seed) is already minimal enough to debug.
@settings(max_examples=12, deadline=None, phases=[Phase.explicit, Phase.generate])
@given(name=st.sampled_from(JITTER_SCENARIOS), seed=st.integers(0, 2**20),
       mode=st.sampled_from(["shared", "eager"]))
def test_merging_replicas_changes_no_result(name, seed, mode, tmp_path_factory):
    """Every jitter class, any seed, both replica modes: results byte for byte the
    plain path's, which keeps every fork apart to the end."""
    sets = ["limits.max_requests=80", f"seed={seed}", f"engine.replicas={mode}"]
    outs = []
    for coalesce in (False, True):
        d = tmp_path_factory.mktemp("co" if coalesce else "plain") / "r"
        _run(name, sets, d, coalesce)
        outs.append(d)
    _same_folders(*outs)


def test_ranks_that_forked_merge_back_and_results_hold(tmp_path):
    """Ranks 1 and 3 drain their late acks alone and fork; they merge back once the
    others catch up, and results stay byte for byte the plain path's."""
    ends = {}
    for coalesce in (False, True):
        res = _run("jitter_ack_local", [], tmp_path / str(coalesce), coalesce)
        groups = [inst.group for inst in res.sim.instances]
        ends[coalesce] = (sum(len(g.forks) for g in groups), sum(len(g.merges) for g in groups))
    _same_folders(tmp_path / "False", tmp_path / "True")
    assert ends[False][0] >= 2 and ends[False][1] == 0  # ranks 1 and 3 fork, once each
    # merged back and forked again, over and over: each merge lasted till a new fork
    assert ends[True][1] > 10 and ends[True][0] >= ends[True][1]


@pytest.mark.parametrize("name", ["hybrid_mamba", "hybrid_swa_host"])
def test_hybrid_replicas_merge_back_and_results_hold(name, tmp_path):
    """A hybrid replica (its component's pools and request states beside the tree)
    compares and merges the same way."""
    merges = {}
    for coalesce in (False, True):
        res = _run(name, ["workload.num_requests=200", "engine.replicas=eager"],
                   tmp_path / str(coalesce), coalesce)
        merges[coalesce] = sum(len(inst.group.merges) for inst in res.sim.instances)
    _same_folders(tmp_path / "False", tmp_path / "True")
    assert merges[False] == 0 and merges[True] > 1


@pytest.mark.parametrize("name,sets", [
    # rank 1's store misses pages: it keeps its replica; the others merge
    ("storage_mooncake", ["tp=4"]),
    # so does a rank with a slow backend
    ("storage_slow_rank", ["tp=4"]),
    # buffer_only: the host pool is a staging buffer, in each replica's storage state
    ("storage_buffer_only", ["tp=4"]),
])
def test_replicas_with_the_storage_tier_merge_back_and_results_hold(name, sets, tmp_path):
    """Each replica's storage state (its prefetch book, storage view, queues and
    call counts) is part of the comparison; a replica merges only with no storage
    call, prefetch or write in flight. Shared replicas write the same folder: with
    four replicas and a slow one, every poll of a prefetch in one admission reads
    the progress the ranks agreed before it (``StorageEngine.completed``)."""
    ends = {}
    for coalesce in (False, True):
        res = _run(name, ["workload.num_requests=300", "engine.replicas=eager", *sets],
                   tmp_path / str(coalesce), coalesce)
        groups = [inst.group for inst in res.sim.instances]
        ends[coalesce] = (sum(len(g.merges) for g in groups),
                          [sorted(c.ranks for c in g.cohorts) for g in groups],
                          {r for g in groups for r in g.pinned})
    _run(name, ["workload.num_requests=300", "engine.replicas=shared", *sets],
         tmp_path / "shared", True)
    _same_folders(tmp_path / "False", tmp_path / "True")
    _same_folders(tmp_path / "False", tmp_path / "shared")
    assert ends[False][0] == 0 and ends[True][0] >= 1
    for cohorts in ends[True][1]:
        # a pinned rank (its own storage faults or latency) ends alone
        for r in ends[True][2]:
            assert [r] in cohorts


STORAGE_SCENARIOS = ["storage_mooncake", "storage_slow_rank", "storage_buffer_only",
                     "storage_mooncake_trace"]


@settings(max_examples=8, deadline=None, phases=[Phase.explicit, Phase.generate])
@given(name=st.sampled_from(STORAGE_SCENARIOS), seed=st.integers(0, 2**20),
       tp=st.sampled_from([2, 4]))
def test_storage_replicas_shared_eager_and_merged_agree(name, seed, tp, tmp_path_factory):
    """With the storage tier: shared replicas, eager ones kept apart and eager ones
    merging back write the same folder, any seed."""
    sets = ["limits.max_requests=80", f"seed={seed}", f"tp={tp}"]
    outs = []
    for mode, coalesce in (("shared", True), ("eager", False), ("eager", True)):
        d = tmp_path_factory.mktemp(f"{mode}{int(coalesce)}") / "r"
        _run(name, [*sets, f"engine.replicas={mode}"], d, coalesce)
        outs.append(d)
    _same_folders(outs[0], outs[1])
    _same_folders(outs[1], outs[2])


def _sims(tp=4, **kw):
    cfg = SimConfig(tp=tp, page_size=4, device_tokens=60 * 16, host_tokens=80 * 16, seed=3,
                    load_back_threshold=1, replicas="eager", **kw)
    out = {}
    for coalesce in (False, True):
        with pytest.MonkeyPatch.context() as m:
            m.setattr(Simulation, "coalesce_replicas", coalesce)
            out[coalesce] = simulate(cfg, seed=3)
    return out


def test_eager_replicas_merge_into_one_and_report_the_same():
    sims = _sims()
    plain, merged = sims[False], sims[True]
    assert len(plain.group.cohorts) == 4 and not plain.group.merges
    assert len(merged.group.cohorts) == 1 and merged.group.cohorts[0].ranks == [0, 1, 2, 3]
    assert [m["ranks"] for m in merged.group.merges] == [[1], [2], [3]]
    # a merged-away replica keeps no tree (a long run may merge thousands)
    assert len(merged.group.retired) == 3 and all(c.tree is None for c in merged.group.retired)
    assert merged.metrics.rows == plain.metrics.rows
    assert merged.report() == plain.report()


def test_a_rank_with_its_own_hardware_never_merges():
    from sim.config import JitterConfig
    sims = _sims(jitter=JitterConfig(host_capacity_skew={2: 0}))
    merged = sims[True]
    assert [c.ranks for c in merged.group.cohorts] == [[0, 1, 3], [2]]
    assert merged.metrics.rows == sims[False].metrics.rows


# ------------------------------------------------------------------ the comparison
def _two_trees():
    sim = _sims(tp=2)[False]
    a, b = (c.tree for c in sim.group.cohorts)
    assert Iso().same(a, b)
    return a, b


def test_the_comparison_sees_a_node_field_the_signature_cannot():
    a, b = _two_trees()
    assert signature(sim_cohort(a)) == signature(sim_cohort(b))
    node = max(b.iter_nodes(), key=lambda n: n.id)
    node.last_access += 1.0  # an LRU stamp: the next eviction's order
    assert not Iso().same(a, b)


def test_the_comparison_sees_the_duplicate_maps_order():
    a, b = _two_trees()
    assert len(b.ht.dups) >= 2  # the run leaves four
    first = next(iter(b.ht.dups))
    b.ht.dups[first] = b.ht.dups.pop(first)  # same entries, another reclaim order
    assert not Iso().same(a, b)


def test_the_comparison_sees_a_lock_and_a_leaf_set():
    a, b = _two_trees()
    leaf = next(iter(b.d_leaves))
    b.d_leaves.discard(leaf)
    b.d_leaves.add(b.root)
    assert not Iso().same(a, b)
    a, b = _two_trees()
    max(b.iter_nodes(), key=lambda n: n.id).lock += 1
    assert not Iso().same(a, b)


def test_a_per_call_scratch_result_is_not_state():
    a, b = _two_trees()
    b.ht.host_policy.result.scanned += 7  # rewritten by the next reclaim before any read
    assert Iso().same(a, b)


def test_the_pairing_is_one_to_one():
    """Two places that hold one object on one side and two equal objects on the
    other are different states (a write through one would show through the other)."""
    shared = [1, 2]
    assert Iso().same(([1, 2], [1, 2]), ([1, 2], [1, 2]))
    assert not Iso().same((shared, shared), ([1, 2], [1, 2]))
    x, y = Box(1), Box(1)
    assert not Iso().same((x, x), (x, y))
    assert Iso().same((Box(1), Box(2)), (Box(1), Box(2)))
    assert not Iso().same((Box(1),), (Box(2),))


class Box:
    __slots__ = ("v",)

    def __init__(self, v):
        self.v = v


def sim_cohort(tree):
    """A stand-in cohort around ``tree`` for ``signature``."""
    from sim.ranks import Cohort
    import simpy
    return Cohort(simpy.Environment(), [0], tree)
