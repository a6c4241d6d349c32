"""The one-pass LRU curve (stack distances) against the plain reference simulation."""

import gzip
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.analysis.stack_distance import (
    COLD,
    hit_rate_curve,
    lru_hit_curve,
    lru_prefix_cache_sim,
    lru_stack_distances,
)
import strategies
from conftest import TRACES
from sim.errors import UserError

MOONCAKE_CONVERSATION = TRACES / "mooncake-fast25" / "conversation_trace.jsonl.gz"


def prefix_traces(**kw):
    return strategies.prefix_traces(**{**dict(max_requests=8, max_depth=5, max_fanout=3, max_units=14), **kw})


def per_request_hits(requests, capacity):
    """Per-request hit units at ``capacity`` read off the stack distances."""
    dist = lru_stack_distances(requests)
    out, i = [], 0
    for path in requests:
        d = dist[i : i + len(path)]
        out.append(int(((d >= 1) & (d <= capacity)).sum()))
        i += len(path)
    return out


@settings(max_examples=300, deadline=None)
@given(prefix_traces(), st.integers(0, 16))
def test_curve_equals_reference_simulation(requests, capacity):
    ref = lru_prefix_cache_sim(requests, capacity, check=True)
    assert per_request_hits(requests, capacity) == ref.per_request
    assert lru_hit_curve(requests).hit_units(capacity) == ref.hit_units


@settings(max_examples=200, deadline=None)
@given(prefix_traces())
def test_curve_shape(requests):
    curve = lru_hit_curve(requests)
    hits = [curve.hit_units(c) for c in range(curve.distinct_units + 3)]
    assert hits[0] == 0
    assert all(a <= b for a, b in zip(hits, hits[1:]))
    accesses = sum(len(p) for p in requests)
    distinct = len({u for p in requests for u in p})
    assert (curve.access_units, curve.distinct_units) == (accesses, distinct)
    # Room for every unit: only cold misses remain.
    assert hits[distinct] == hits[-1] == accesses - distinct


def test_hand_worked_distances():
    # Shared root 0; 1 and 2 are siblings. After [0,2], unit 1 is third in LRU order.
    requests = [[0, 1], [0, 2], [0, 1]]
    assert lru_stack_distances(requests).tolist() == [COLD, COLD, 1, COLD, 1, 3]
    assert [lru_hit_curve(requests).hit_units(c) for c in range(5)] == [0, 2, 2, 3, 3]


def test_refresh_moves_units_below_the_request_path():
    # Request 2 ([0,3]) refreshes unit 1 (a split fragment in the tree): afterwards the
    # order is 0, 3, 1, 2, so request 3 finds 1 at rank 3 instead of 4.
    requests = [[0, 1], [0, 2], [0, 3], [0, 1]]
    assert lru_stack_distances(requests).tolist()[-2:] == [1, 4]
    assert lru_stack_distances(requests, {2: [1]}).tolist()[-2:] == [1, 3]
    # Unrefreshed, nothing changes; refreshing an unseen unit is a caller bug.
    assert lru_stack_distances(requests, {}).tolist() == lru_stack_distances(requests).tolist()
    with pytest.raises(ValueError, match="never requested"):
        lru_stack_distances(requests, {0: [7]})


def test_path_longer_than_capacity_keeps_its_shallow_units():
    # Within one request the deepest unit is evicted first, so the prefix survives.
    requests = [[0, 1, 2], [0, 1, 2]]
    assert lru_prefix_cache_sim(requests, 2).per_request == [0, 2]
    assert lru_hit_curve(requests).hit_units(2) == 2


def test_siblings_evicted_leaf_first():
    # With room for 2, inserting 5 evicts the old path's leaf 1; its parent 0 stays.
    requests = [[0, 1], [5], [0, 1]]
    assert lru_prefix_cache_sim(requests, 2).per_request == [0, 0, 1]
    assert per_request_hits(requests, 2) == [0, 0, 1]


def test_hit_rate_curve_counts_whole_pages():
    requests = [[0, 1], [0, 2], [0, 1]]
    points = hit_rate_curve(requests, [0, 511, 512, 1535, 1536], page_tokens=512)
    assert [p.hit_tokens for p in points] == [0, 0, 2 * 512, 2 * 512, 3 * 512]
    assert all(p.input_tokens == 6 * 512 for p in points)
    assert points[-1].hit_rate == pytest.approx(0.5)


@pytest.mark.parametrize(
    "requests",
    [
        [[0, 1], [2, 1]],  # unit 1 under two different parents
        [[0, 0]],  # a unit repeated inside a request
    ],
)
def test_non_prefix_ids_are_rejected(requests):
    with pytest.raises(UserError, match="expected prefix ids"):
        lru_hit_curve(requests)


def test_bad_parameters_are_rejected():
    with pytest.raises(UserError):
        lru_prefix_cache_sim([[0]], -1)
    with pytest.raises(UserError):
        hit_rate_curve([[0]], [100], page_tokens=0)
    with pytest.raises(UserError):
        hit_rate_curve([[0]], [-1], page_tokens=16)


def read_mooncake(path, limit):
    """Full 512-token blocks of each request (SGLang keeps partial pages out)."""
    requests = []
    with gzip.open(path, "rt") as f:
        for line in f:
            record = json.loads(line)
            requests.append(record["hash_ids"][: record["input_length"] // 512])
            if len(requests) == limit:
                break
    return requests


def test_mooncake_conversation_prefix_matches_reference():
    if not MOONCAKE_CONVERSATION.is_file():
        pytest.fail(f"Mooncake trace not found at {MOONCAKE_CONVERSATION}; the repository ships it "
                    "under data/traces/")
    requests = read_mooncake(MOONCAKE_CONVERSATION, 3000)
    curve = lru_hit_curve(requests)
    assert curve.hits_at[-1] > 0  # the trace does reuse prefixes
    for capacity in (0, 1000, 8000, curve.distinct_units):
        assert curve.hit_units(capacity) == lru_prefix_cache_sim(requests, capacity).hit_units
    assert np.all(np.diff(curve.hits_at) >= 0)
