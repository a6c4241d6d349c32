"""Offline-optimum bounds against exhaustive search, and their basic shape."""

import gzip
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.analysis.optimum import (
    brute_force_optimum,
    combine_two_tier,
    brute_force_two_tier,
    optimum_bounds,
    two_tier_bounds,
)
from sim.analysis.stack_distance import lru_hit_curve, lru_prefix_cache_sim
import strategies
from conftest import TRACES
from sim.errors import UserError

MOONCAKE = TRACES / "mooncake-fast25"


def mooncake_file(name):
    """A Mooncake trace under data/traces/; a missing one fails (a skip would hide it)."""
    path = MOONCAKE / name
    if not path.is_file():
        pytest.fail(f"Mooncake trace not found at {path}; the repository ships it under data/traces/")
    return path


def prefix_traces(**kw):
    return strategies.prefix_traces(**{**dict(max_requests=7, max_depth=4, max_fanout=3, max_units=9), **kw})


@settings(max_examples=250, deadline=None)
@given(prefix_traces(), st.integers(0, 6), st.sampled_from([1, 16]))
def test_single_tier_bounds_bracket_and_equal_brute_force(requests, capacity, page):
    b = optimum_bounds(requests, capacity, page)
    best = brute_force_optimum(requests, capacity) * page
    assert b.lower_hit_tokens <= best <= b.upper_hit_tokens
    assert b.exact  # the model's optimum is proven exact (module docstring) ...
    assert b.lower_hit_tokens == best  # ... and brute force agrees


@settings(max_examples=200, deadline=None)
@given(prefix_traces(), st.integers(0, 6))
def test_forced_insertion_bounds_bracket_brute_force(requests, capacity):
    b = optimum_bounds(requests, capacity, 1, bypass=False)
    best = brute_force_optimum(requests, capacity, bypass=False)
    assert b.lower_hit_tokens <= best <= b.upper_hit_tokens
    assert b.upper_hit_tokens == brute_force_optimum(requests, capacity)
    # Not proven (module docstring): farthest-next-use with forced insertion is
    # conjectured optimal; a counterexample here would refute the conjecture.
    assert b.lower_hit_tokens == best
    assert b.lower_hit_tokens >= lru_prefix_cache_sim(requests, capacity).hit_units


@settings(max_examples=120, deadline=None)
@given(
    prefix_traces(max_requests=6, max_units=7),
    st.integers(0, 3),
    st.integers(0, 3),
    st.sampled_from([0.0, 0.25, 0.5, 1.0]),
)
def test_two_tier_bounds_bracket_and_equal_brute_force(requests, device, host, weight):
    b = two_tier_bounds(requests, device, host, page_tokens=1, host_weight=weight)
    best = brute_force_two_tier(requests, device, host, weight)
    assert b.lower_hit_tokens <= best <= b.upper_hit_tokens
    assert b.exact
    assert b.lower_hit_tokens == best
    assert b.device_hit_tokens + weight * b.host_hit_tokens == b.lower_hit_tokens


@settings(max_examples=200, deadline=None)
@given(prefix_traces(max_units=30, max_requests=12), st.integers(0, 12))
def test_optimum_dominates_lru(requests, capacity):
    # LRU (insert everything, evict leaf-first) is one schedule the optimum may use.
    lru = lru_prefix_cache_sim(requests, capacity).hit_units
    assert optimum_bounds(requests, capacity, 1).lower_hit_tokens >= lru


@settings(max_examples=150, deadline=None)
@given(prefix_traces(max_units=30, max_requests=12))
def test_optimum_shape_in_capacity(requests):
    accesses = sum(len(p) for p in requests)
    distinct = len({u for p in requests for u in p})
    hits = [optimum_bounds(requests, c, 1).lower_hit_tokens for c in range(distinct + 2)]
    assert hits[0] == 0
    assert all(a <= b for a, b in zip(hits, hits[1:]))
    assert hits[distinct] == hits[-1] == accesses - distinct  # cold misses only
    assert hits[-1] == lru_hit_curve(requests).hit_units(distinct)


@settings(max_examples=100, deadline=None)
@given(prefix_traces(max_units=30, max_requests=12), st.integers(0, 8), st.integers(0, 8))
def test_two_tier_reduces_to_single_tier(requests, device, host):
    union = optimum_bounds(requests, device + host, 1)
    device_only = optimum_bounds(requests, device, 1)
    assert two_tier_bounds(requests, device, host, 1).upper_hit_tokens == union.upper_hit_tokens
    no_host_value = two_tier_bounds(requests, device, host, 1, host_weight=0.0)
    assert no_host_value.lower_hit_tokens == device_only.lower_hit_tokens
    no_host_room = two_tier_bounds(requests, device, 0, 1, host_weight=0.5)
    assert no_host_room.lower_hit_tokens == device_only.lower_hit_tokens


@given(prefix_traces(max_units=30, max_requests=12), st.integers(0, 8), st.integers(0, 8),
       st.sampled_from([0.0, 0.5, 1.0]))
def test_combined_two_tier_equals_two_tier_bounds(requests, device, host, weight):
    combined = combine_two_tier(optimum_bounds(requests, device, 64),
                                optimum_bounds(requests, device + host, 64), weight)
    direct = two_tier_bounds(requests, device, host, 64, host_weight=weight)
    assert combined.lower_hit_tokens == pytest.approx(direct.lower_hit_tokens)
    assert combined.upper_hit_tokens == pytest.approx(direct.upper_hit_tokens)
    assert (combined.device_hit_tokens, combined.host_hit_tokens, combined.exact) == (
        direct.device_hit_tokens, direct.host_hit_tokens, direct.exact)


def test_hand_worked_optimum_beats_lru():
    # Keep [0,1] through the detour to [0,2] (bypass 2): 1 + 2 hits; LRU evicts 1.
    requests = [[0, 1], [0, 2], [0, 1]]
    assert brute_force_optimum(requests, 2) == 3
    assert optimum_bounds(requests, 2, 512).lower_hit_tokens == 3 * 512
    assert lru_prefix_cache_sim(requests, 2).hit_units == 2


def test_forced_insertion_costs_hits():
    # Same trace: if [0,2] must be kept, 1 goes (or 0 and then 1), so only 2 hits.
    requests = [[0, 1], [0, 2], [0, 1]]
    b = optimum_bounds(requests, 2, 1, bypass=False)
    assert (b.lower_hit_tokens, b.upper_hit_tokens, b.exact) == (2, 3, False)
    assert brute_force_optimum(requests, 2, bypass=False) == 2


def test_hand_worked_cyclic_trace():
    # Three units in a cycle, room for two: LRU never hits; the optimum keeps two.
    requests = [[0], [1], [2], [0], [1], [2]]
    assert lru_prefix_cache_sim(requests, 2).hit_units == 0
    b = optimum_bounds(requests, 2, 1)
    assert (b.lower_hit_tokens, b.upper_hit_tokens, b.input_tokens, b.exact) == (2, 2, 6, True)


def test_hand_worked_two_tier():
    # Device 1, host 1, weight 0.5: device keeps 0 (hit at request 2), host keeps 1.
    requests = [[0], [1], [0], [1]]
    b = two_tier_bounds(requests, 1, 1, page_tokens=1, host_weight=0.5)
    assert (b.device_hit_tokens, b.host_hit_tokens) == (1, 1)
    assert b.lower_hit_tokens == b.upper_hit_tokens == 1.5 == brute_force_two_tier(requests, 1, 1, 0.5)


def test_bad_parameters_are_rejected():
    with pytest.raises(UserError, match="host_weight"):
        two_tier_bounds([[0]], 1, 1, 16, host_weight=1.5)
    with pytest.raises(UserError, match="capacity_units"):
        optimum_bounds([[0]], -1, 16)
    with pytest.raises(UserError, match="device_units"):
        two_tier_bounds([[0]], True, 1, 16)
    with pytest.raises(UserError, match="page_tokens"):
        optimum_bounds([[0]], 1, 0)
    with pytest.raises(UserError, match="expected prefix ids"):
        optimum_bounds([[0, 1], [2, 1]], 2, 16)


@pytest.mark.parametrize("name", ["conversation_trace.jsonl.gz", "synthetic_trace.jsonl.gz"])
def test_mooncake_bounds(name):
    requests = []
    with gzip.open(mooncake_file(name), "rt") as f:
        for line in f:
            record = json.loads(line)
            requests.append(record["hash_ids"][: record["input_length"] // 512])  # full pages only
            if len(requests) == 2000:
                break
    lru = lru_hit_curve(requests)
    previous = 0
    for capacity in (500, 2000, 8000):
        b = optimum_bounds(requests, capacity, 512)
        assert b.exact
        assert b.upper_hit_tokens >= previous
        assert b.lower_hit_tokens >= lru.hit_units(capacity) * 512
        previous = b.upper_hit_tokens
    tiers = two_tier_bounds(requests, 500, 1000, 512, host_weight=0.5)
    assert tiers.exact
    assert tiers.device_hit_tokens == optimum_bounds(requests, 500, 512).lower_hit_tokens
