"""sim/storage: backend cost shapes, prefetch decisions, host memory modes, the
cross-rank collectives and one replica's prefetch book (docs/STORAGE.md). Each
expected value is worked out by hand from SGLang 0.5.23's code, cited in the module."""

from __future__ import annotations

import pytest

from sim import constants as C
from sim.storage import backends, collectives, policy
from sim.storage.prefetch import PrefetchBook, PrefetchError
from sim.tree import Tree


# ------------------------------------------------------------------ backends
def test_sim_backend_defaults_and_shape():
    b = backends.sim_backend()
    assert (b.write_gbps, b.read_gbps, b.op_latency_us) == (5.0, 5.0, 100.0)
    # _sleep_io: op latency + bytes / (gbps * 1e9)
    assert b.write_seconds(5 * 10**9) == pytest.approx(1.0 + 100e-6, rel=0, abs=1e-12)
    assert b.read_seconds(0) == pytest.approx(100e-6)
    assert b.exists_seconds() == pytest.approx(100e-6)


def test_sim_backend_extra_config_as_sglang_reads_it():
    b = backends.sim_backend({"sim_write_gbps": 2, "sim_op_latency_us": 0})
    assert b.read_gbps == 2.0            # read defaults to the write figure
    assert b.write_seconds(10**9) == 0.5
    inf = backends.sim_backend({"sim_write_gbps": 0, "sim_read_gbps": -1})
    assert inf.write_seconds(10**12) == pytest.approx(100e-6)  # <= 0 GB/s: infinite
    assert inf.read_seconds(10**12) == pytest.approx(100e-6)


def test_registry_names_sources_and_overrides():
    assert {"sim", "file", "mooncake", "3fs", "nixl"} <= set(backends.BACKENDS)
    for name, b in backends.BACKENDS.items():
        assert b.name == name and b.source and b.write_gbps > 0 and b.read_gbps > 0
    assert backends.BACKENDS["mooncake"].read_gbps == pytest.approx(190 / 8)
    fast = backends.backend("3fs", op_latency_us=0.0)
    assert fast.op_latency_us == 0.0 and fast.read_gbps == backends.BACKENDS["3fs"].read_gbps
    with pytest.raises(KeyError, match="unknown storage backend 'tape'; expected one of"):
        backends.backend("tape")
    with pytest.raises(ValueError):
        backends.per_rank(10.0, 0)


def test_prefetch_reads_go_in_batches_of_128_pages():
    assert backends.prefetch_batches(0) == []
    assert backends.prefetch_batches(300) == [128, 128, 44]
    b = backends.sim_backend({"sim_read_gbps": 1, "sim_op_latency_us": 1000})
    # three calls: 3 ms of latency, 300 pages of 1 MB at 1 GB/s
    assert backends.prefetch_read_seconds(b, 300, 10**6) == pytest.approx(0.003 + 0.3)
    assert backends.prefetch_read_seconds(b, 0, 10**6) == 0.0


# ------------------------------------------------------------------ thresholds, timeout
def test_thresholds():
    assert policy.tree_prefetch_threshold() == C.PREFETCH_THRESHOLD_DEFAULT == 256
    assert policy.tree_prefetch_threshold(64, page_size=128) == 64  # no max on the tree
    assert policy.controller_prefetch_threshold(64, 128) == 128
    assert policy.tree_prefetch_threshold(64, host_memory_mode="buffer_only",
                                          swa_full_window_pages=4, page_size=64) == 256
    assert policy.tree_prefetch_threshold(64, host_memory_mode="cache",
                                          swa_full_window_pages=4, page_size=64) == 64
    with pytest.raises(ValueError, match="prefetch_threshold must be int"):
        policy.tree_prefetch_threshold(256.0)


def test_timeout_formula():
    # base + (requested // page) * (page / 1024 * per_ki_token)
    assert policy.prefetch_timeout_s(1024, 64) == 1.25
    assert policy.prefetch_timeout_s(1000, 64) == 1.0 + 15 * 0.015625
    assert policy.prefetch_timeout_s(16010 * 64, 64, 2.0, 1.0) == 2.0 + 16010 * 0.0625
    assert policy.prefetch_timeout_s(0, 1) == 1.0


def test_issue_decision_order_and_capacity():
    assert policy.prefetch_capacity_limit(1001) == 500
    assert policy.prefetch_capacity_limit(1000, "buffer_only") == 900
    assert policy.issue_decision(0, 256, 0, 100) == "empty"
    assert policy.issue_decision(255, 256, 10**6, 100) == "too_short"  # checked first
    assert policy.issue_decision(256, 256, 100, 100) == "rate_limited"
    assert policy.issue_decision(256, 256, 99, 100) is None
    assert policy.anchor_allows_prefetch(True, False) and policy.anchor_allows_prefetch(False, True)
    assert not policy.anchor_allows_prefetch(False, False)


def test_storage_hit_alloc_evicts_the_whole_hit_then_falls_back_to_partial():
    free = [3]
    asked = []

    def evict(n):
        asked.append(n)
        free[0] += 2
        return 2

    # fits: no eviction
    assert policy.storage_hit_alloc(3, lambda: free[0], evict, 1, 1) == 3 and asked == []
    # does not fit: evicts the whole hit (8), then partial min(8, 5) >= 4
    assert policy.storage_hit_alloc(8, lambda: free[0], evict, 1, 4) == 5 and asked == [8]
    # partial rounded down to a page, below the threshold: revoked
    free[0] = 5
    assert policy.storage_hit_alloc(16, lambda: free[0], lambda n: 0, 4, 8) == 0
    assert policy.storage_hit_alloc(16, lambda: 9, lambda n: 0, 4, 8) == 8
    assert policy.hit_decision(3, 4, False) == "below_threshold"
    assert policy.hit_decision(8, 4, True) == "terminated"
    assert policy.hit_decision(4, 4, False) is None


# ------------------------------------------------------------------ stop policies
def _poll(pol, wait, now, terminated=False, kv_landed=False):
    return policy.poll(pol, terminated=terminated, kv_landed=kv_landed, wait=wait, now=now,
                       requested_tokens=1024, page_size=64)


def test_best_effort_and_wait_complete():
    assert _poll("best_effort", None, 0.0) == (True, None)
    assert _poll("wait_complete", None, 10**6) == (False, None)
    assert _poll("wait_complete", None, 0.0, terminated=True) == (True, None)


def test_timeout_starts_at_the_first_blocked_poll_and_is_strict():
    done, wait = _poll("timeout", None, 100.0)       # first poll: blocks, starts timer
    assert not done and wait.started_at == 100.0 and wait.timeout_s == 1.25
    assert _poll("timeout", wait, 101.25) == (False, wait)   # elapsed == timeout: not yet
    done, wait2 = _poll("timeout", wait, 101.5)
    assert done and wait2 is wait and wait.expired
    assert _poll("timeout", wait, 101.6)[0]          # an expired wait stays expired
    fresh = policy.PrefetchWait(1.0, 0.0)
    assert not _poll("timeout", fresh, 5.0, kv_landed=True)[0]  # all KV landed: wait
    assert policy.terminate_consensus([0, 0, 1]) and not policy.terminate_consensus([0, 0])


def test_prefetch_policies_are_a_registry_the_schema_offers():
    """Each stop policy is an object in ``PREFETCH_POLICIES``, keyed by SGLang's name;
    the scenario offers exactly those names, and a poll given the object decides as
    one given the name."""
    import typing

    from sim.scenario import Storage

    names = typing.get_args(Storage.model_fields["prefetch_policy"].annotation)
    assert names == tuple(policy.PREFETCH_POLICIES) == ("best_effort", "wait_complete", "timeout")
    assert [p.timed for p in policy.PREFETCH_POLICIES.values()] == [False, False, True]
    for name, pol in policy.PREFETCH_POLICIES.items():
        assert pol.name == name
        for wait, now in ((None, 0.0), (policy.PrefetchWait(1.0, 0.0), 2.0)):
            w1 = None if wait is None else policy.PrefetchWait(wait.timeout_s, wait.started_at)
            w2 = None if wait is None else policy.PrefetchWait(wait.timeout_s, wait.started_at)
            assert _poll(name, w1, now) == _poll(pol, w2, now)


# ------------------------------------------------------------------ host memory modes
def test_host_modes_resolve_as_sglang():
    m = policy.resolve_host_mode()
    assert (m.mode, m.write_policy, m.hicache_ratio, m.tree_holds_host) == ("cache", "write_through", 2.0, True)
    b = policy.resolve_host_mode("buffer_only", storage_backend="mooncake", write_policy="write_back")
    assert (b.mode, b.write_policy, b.hicache_ratio, b.tree_holds_host) == ("buffer_only", "write_through", 1.2, False)
    assert policy.resolve_host_mode(hicache_ratio=3.0).hicache_ratio == 3.0
    assert policy.resolve_host_mode(disaggregation_mode="decode").hicache_ratio is None
    with pytest.raises(ValueError, match="requires a storage backend"):
        policy.resolve_host_mode("buffer_only")
    with pytest.raises(ValueError, match="decode"):
        policy.resolve_host_mode("buffer_only", storage_backend="file", disaggregation_mode="decode")
    with pytest.raises(ValueError, match="must be 'cache' or 'buffer_only'"):
        policy.resolve_host_mode("buffer")


# ------------------------------------------------------------------ collectives
def test_min_hits_cuts_every_rank_to_the_worst():
    assert collectives.min_hits([4096, 4096, 0, 4096], 64) == 0   # one missing rank (#37149)
    assert collectives.min_hits([1000, 1100], 64) == 960           # MIN, then page-aligned
    assert collectives.min_hits([1000, 1100], 64, align=False) == 1000
    with pytest.raises(ValueError):
        collectives.min_hits([])


def test_sync_vector_layout():
    assert collectives.sync_vector(2, 1, 7) == [2, 1, 7, -7]
    v = collectives.sync_vector(2, 1, 7, storage_queues=(3, 4, 5, 6), extra_release=(8,))
    assert v == [2, 1, 3, 4, 5, 6, 8, 7, -7]
    assert collectives.sync_vector(2, 1, 7, storage_queues=(3, 4, 5, 6), extra_release=(8,),
                                   placeholder=True) == [0, 0, 0, 0, 0, 0, 0, 7, -7]
    assert collectives.storage_queue_slots(True, ("swa",)) == 5
    assert collectives.storage_queue_slots(False, ("swa",)) == 0
    with pytest.raises(ValueError, match="expected 4"):
        collectives.sync_vector(0, 0, 0, storage_queues=(1, 2))
    with pytest.raises(ValueError):
        collectives.sync_vector(0, 0, 0, extra_release=(1,))


def test_reduced_sync_vector_drains_the_min_and_checks_digests():
    r0 = collectives.sync_vector(3, 0, 5, storage_queues=(2, 1, 0, 4))
    r1 = collectives.sync_vector(1, 2, 5, storage_queues=(1, 3, 2, 4))
    w, lo, queues, ok = collectives.unpack_sync_vector(collectives.all_reduce_min([r0, r1]))
    assert (w, lo, queues, ok) == (1, 0, (1, 1, 0, 4), True)
    r2 = collectives.sync_vector(1, 2, 6, storage_queues=(1, 3, 2, 4))
    assert not collectives.unpack_sync_vector(collectives.all_reduce_min([r0, r2]))[3]
    with pytest.raises(ValueError, match="different lengths"):
        collectives.all_reduce_min([r0, collectives.sync_vector(1, 2, 5)])


# ------------------------------------------------------------------ the prefetch book
def _book(host=16, threshold=2, **kw):
    t = Tree(device_capacity=32, host_capacity=host, **kw)
    return t, PrefetchBook(t, threshold)


def test_book_locks_the_anchor_and_releases_everything_on_revoke():
    t, b = _book()
    t.insert([1, 2])
    t.evict_device(2)
    key = [1, 2, 3, 4, 5]
    res = b.issue("p", t.match_prefix(key), key)
    anchor = res.anchor
    assert res.reason is None and res.requested == 3 and anchor.host_lock == 1
    assert anchor not in t.h_leaves and b.occupied == 3
    assert b.hit("p", 3).staged == 3 and t.host_reserved == 3
    b.revoke("p")
    assert (t.host_reserved, b.occupied, anchor.host_lock) == (0, 0, 0)
    assert anchor in t.h_leaves
    with pytest.raises(PrefetchError) as e:
        b.revoke("p")
    assert e.value.code == "unknown_prefetch_id"


def test_book_done_adopts_part_and_releases_the_tail():
    t, b = _book()
    key = [1, 2, 3, 4, 5, 6]
    b.issue("p", t.match_prefix(key), key)
    b.hit("p", 6)
    res, loaded = b.done("p", 4)
    assert loaded == 4 and res.node.key == [1, 2, 3, 4] and t.host_used == 4
    assert t.host_reserved == 0 and b.occupied == 0 and not b.prefetches
    t.check()


def test_book_rate_limit_and_storage_writes():
    t, b = _book(host=8)       # limit int(0.5 * 8) = 4
    k1, k2 = [1, 2, 3, 4], [5, 6]
    assert b.issue("a", t.match_prefix(k1), k1).reason is None
    assert b.issue("b", t.match_prefix(k2), k2).reason == "rate_limited"
    t.insert([9, 9])
    node = t.match_prefix([9, 9]).best
    assert b.write("w", node) is False          # no host copy: nothing written
    t.evict_device(2)
    assert b.write("w", node) is True and node.host_lock == 1
    assert t.evict_host(2).freed == 0           # the storage write holds it
    b.write_ack("w")
    assert t.evict_host(2).freed == 2


def test_clone_keeps_staged_slots_but_not_the_storage_hook():
    t, b = _book()
    key = [1, 2, 3]
    b.issue("p", t.match_prefix(key), key)
    b.hit("p", 3)
    t.on_host_backup = lambda node: None
    c = t.clone()
    assert c.host_reserved == 3 and c.on_host_backup is None
    c.check()


# ------------------------------------------------------------------ storage views
def test_page_keys_name_the_prefix():
    from sim.storage.view import page_keys
    a = page_keys([1, 2, 3])
    assert a == page_keys([1, 2, 3]) and len(set(a)) == 3
    assert page_keys([9, 2, 3])[1:] != a[1:]             # same pages, other prefix
    assert page_keys([3], parent_key=a[1]) == a[2:]       # continues a chain


def test_views_per_rank_and_the_min_they_give():
    from sim.storage.view import StorageView, page_keys, rank_hits
    keys = page_keys(range(10))
    r0, r1 = StorageView(), StorageView()
    r0.write(keys)
    r1.write(keys[:6])
    assert r0.exists(keys) == 10 and r1.exists(keys) == 6
    r0.drop(keys[2:3])                                    # a hole: the hit stops there
    assert r0.exists(keys) == 2
    hits = rank_hits([r0, r1], keys, 64)
    assert hits == [128, 384] and collectives.min_hits(hits, 64) == 128


def test_view_capacity_evicts_least_recent():
    from sim.storage.view import StorageView
    v = StorageView(capacity_pages=3)
    v.write([1, 2, 3])
    v.read([1])
    v.write([4])                                          # evicts 2, the least recent
    assert 2 not in v and {1, 3, 4} <= set(v._keys) and v.evicted == 1
    assert v.exists([1, 3]) == 2 and v.exists([2, 1]) == 0
    with pytest.raises(ValueError):
        StorageView(-1)
