"""The real radix tree run as a single-tier LRU, against the stack-distance model.

The claims tested are those of ``sim/analysis/lru_tree.py``: with single-page nodes the
tree equals the page-granular LRU exactly; in general its hits are exactly the
split-aware stack distances read at its occupancy, which sandwiches it between the
curve at ``C - overshoot`` and at ``C``.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

import strategies
from conftest import TRACES
from sim.analysis.lru_tree import compare_lru, mooncake_trace, lru_tree_curve, run_lru_tree
from sim.analysis.stack_distance import (
    hit_rate_curve,
    lru_hit_curve,
    lru_prefix_cache_sim,
    lru_stack_distances,
)
from sim.errors import UserError

MOONCAKE = TRACES / "mooncake-fast25"


def prefix_traces(**kw):
    return strategies.prefix_traces(**{**dict(max_requests=10, max_depth=6, max_fanout=3, max_units=16), **kw})


@st.composite
def disjoint_path_traces(draw, max_paths=4, max_len=5, max_requests=10):
    """Requests that repeat a few unit-disjoint paths: nothing is ever split, but
    multi-page nodes are evicted whole."""
    n_paths = draw(st.integers(1, max_paths))
    paths, next_id = [], 0
    for _ in range(n_paths):
        k = draw(st.integers(1, max_len))
        paths.append(list(range(next_id, next_id + k)))
        next_id += k
    picks = draw(st.lists(st.integers(0, n_paths - 1), min_size=1, max_size=max_requests))
    return [paths[i] for i in picks]


def per_request(requests, capacities, refresh=None):
    """Hit units per request when request ``r`` sees a cache of ``capacities[r]`` units,
    read off the (split-aware) stack distances."""
    dist = lru_stack_distances(requests, refresh)
    out, i = [], 0
    for r, path in enumerate(requests):
        d = dist[i:i + len(path)]
        out.append(int(((d >= 1) & (d <= capacities[r])).sum()))
        i += len(path)
    return out


@given(prefix_traces(), st.integers(0, 18), st.sampled_from([1, 16]),
       st.sampled_from(["write_back", "write_through"]))
def test_single_page_nodes_equal_the_page_lru(requests, capacity, page, policy):
    rep = run_lru_tree(requests, capacity * page, page, unit_nodes=True, write_policy=policy)
    reference = lru_prefix_cache_sim(requests, capacity)
    assert list(rep.per_request) == reference.per_request
    assert rep.per_request == tuple(per_request(requests, [capacity] * len(requests)))
    assert rep.hit_tokens == hit_rate_curve(requests, [capacity * page], page)[0].hit_tokens
    assert (rep.splits, rep.max_overshoot_tokens) == (0, 0)


@given(prefix_traces(), st.integers(0, 18), st.sampled_from([1, 64]))
def test_tree_hits_are_split_aware_stack_distances_at_its_occupancy(requests, capacity, page):
    rep = run_lru_tree(requests, capacity * page, page)
    # Exact: the cache is always the top `occupancy` units of the split-aware order.
    assert list(rep.per_request) == per_request(requests, rep.occupancy, rep.refreshed)
    # Occupancy: at most C; after the first eviction at least C minus the overshoot.
    o = rep.max_overshoot_units
    assert all(m <= capacity for m in rep.occupancy)
    longest = max(len(p) for p in requests)
    assert o <= max(0, longest - 1)  # a node is never longer than a request
    n = len(requests)
    sandwich_low = per_request(requests, [max(0, capacity - o)] * n, rep.refreshed)
    sandwich_high = per_request(requests, [capacity] * n, rep.refreshed)
    assert all(lo <= t <= hi for lo, t, hi in zip(sandwich_low, rep.per_request, sandwich_high))
    # write_through with no host deletes its victims: the same LRU.
    same = run_lru_tree(requests, capacity * page, page, write_policy="write_through")
    assert same.per_request == rep.per_request


@given(disjoint_path_traces(), st.integers(0, 12))
def test_without_splits_the_plain_curve_sandwiches_the_tree(requests, capacity):
    rep = run_lru_tree(requests, capacity, 1)
    assert rep.splits == 0 and rep.refreshed == {}
    o = rep.max_overshoot_units
    assert o <= max(len(p) for p in requests) - 1
    n = len(requests)
    low = per_request(requests, [max(0, capacity - o)] * n)
    high = per_request(requests, [capacity] * n)
    assert all(lo <= t <= hi for lo, t, hi in zip(low, rep.per_request, high))
    curve = lru_hit_curve(requests)
    assert curve.hit_units(max(0, capacity - o)) <= rep.hit_tokens <= curve.hit_units(capacity)


def test_whole_node_eviction_loses_a_hit():
    # [1,2,3] is one 3-page node. Room for 3: [4] needs one page, the tree frees the
    # whole node (overshoot 2); the page model only drops 3, so [1] still hits there.
    requests = [[1, 2, 3], [4], [1]]
    rep = run_lru_tree(requests, 3, 1)
    assert rep.per_request == (0, 0, 0)
    assert (rep.evictions, rep.evicted_nodes, rep.overshoot_tokens) == (1, 1, 2)
    assert lru_prefix_cache_sim(requests, 3).per_request == [0, 0, 1]
    assert run_lru_tree(requests, 3, 1, unit_nodes=True).per_request == (0, 0, 1)


def test_split_refresh_keeps_a_fragment_lru_would_drop():
    # [1,2,3] is one node; [9] is newer; [1,5] splits it and refreshes [2,3]. With
    # room for 5, [7] evicts the oldest leaf: [9] in the tree, but page 3 in the model.
    requests = [[1, 2, 3], [9], [1, 5], [7], [1, 2, 3]]
    rep = run_lru_tree(requests, 5, 1)
    assert rep.refreshed == {2: (2, 3)}
    assert rep.per_request == (0, 0, 1, 0, 3)
    assert lru_prefix_cache_sim(requests, 5).per_request == [0, 0, 1, 0, 2]
    assert per_request(requests, rep.occupancy, rep.refreshed) == list(rep.per_request)


def test_request_longer_than_the_cache_keeps_its_shallow_pages():
    requests = [[1, 2, 3, 4], [1, 2, 3, 4]]
    rep = run_lru_tree(requests, 2 * 16, 16)
    assert rep.per_request == (0, 2)
    assert rep.truncated_tokens == 2 * 2 * 16
    assert lru_prefix_cache_sim(requests, 2).per_request == [0, 2]


def test_curve_is_one_run_per_capacity():
    requests = [[1, 2], [1, 3], [1, 2], [4]]
    reps = lru_tree_curve(requests, [0, 16, 32, 64], 16, input_tokens=100)
    # Room for one page: [1] survives each request; for four, [1,2] hits whole.
    assert [r.hit_tokens for r in reps] == [0, 32, 32, 48]
    assert [r.hit_tokens for r in reps] == [
        p.hit_tokens for p in hit_rate_curve(requests, [0, 16, 32, 64], 16)]
    assert reps[-1].hit_rate == pytest.approx(0.48)
    assert [r.capacity_tokens for r in reps] == [0, 16, 32, 64]


def test_bad_input_is_a_user_error():
    with pytest.raises(UserError, match="capacity"):
        run_lru_tree([[1]], -1, 16)
    with pytest.raises(UserError, match="page_tokens"):
        run_lru_tree([[1]], 16, 0)
    with pytest.raises(UserError, match="expected prefix ids"):
        run_lru_tree([[1, 2], [3, 2]], 16, 1)


@pytest.mark.parametrize("name", ["conversation_trace.jsonl.gz", "synthetic_trace.jsonl.gz"])
def test_mooncake_tree_matches_split_aware_curve(name):
    path = MOONCAKE / name
    if not path.is_file():
        pytest.fail(f"Mooncake trace not found at {path}; the repository ships it under data/traces/")
    full = mooncake_trace(path, 512)
    trace = type(full)(full.paths[:1500], 512, full.input_tokens)
    rows = compare_lru(trace, [500_000, 4_000_000])
    for row in rows:
        rep = row.tree
        assert list(rep.per_request) == per_request(trace.paths, rep.occupancy, rep.refreshed)
        assert rep.splits > 0 and rep.max_overshoot_tokens > 0  # both effects are real here
        assert row.stack_hit_tokens > 0 and row.tree_hit_tokens > 0
