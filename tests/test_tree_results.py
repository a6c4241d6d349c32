"""Tree operations return result objects that say exactly what the op did.

Unit tests build each situation by hand; the equivalence tests replay the conformance
cases and generated op-traces and check, op by op, that the result objects account for
every change of the monotone ``tree.stats`` counters.
"""

import pytest

from conftest import case_id, conformance_cases
from test_tree import node_at, wb  # the tree tests' own builders
from sim.optrace import Replayer, read_trace
from sim.optrace_gen import generate
from sim.policies.host import Reclaim
from sim.tree import NO_HOST_EVICTION, Eviction, HostEviction, Insert, LoadResult, Tree, TreeError




def delta(before: dict, tree) -> dict:
    return {k: v - before[k] for k, v in tree.stats.as_dict().items() if v != before[k]}


# ------------------------------------------------------------------ insert
def test_write_back_insert_reports_prefix_new_and_node():
    t = wb()
    a = t.insert([1, 2, 3])
    assert isinstance(a, Insert)
    assert (a.prefix_tokens, a.new_device_tokens) == (0, 3)
    assert a.node is node_at(t, [1, 2, 3])
    b = t.insert([1, 2, 7, 7])  # splits [1, 2, 3]
    assert (b.prefix_tokens, b.new_device_tokens, b.split) == (2, 2, True)
    assert b.node.key == [7, 7] and b.node.parent.key == [1, 2]
    assert b.writes == [] and b.backups_failed == 0 and b.host is NO_HOST_EVICTION
    e = t.insert([])
    assert e.node is t.root and (e.prefix_tokens, e.new_device_tokens) == (0, 0)


def test_insert_under_write_through_reports_its_writes_in_issue_order():
    t = Tree(device_capacity=32, host_capacity=32, write_policy="write_through", load_back_threshold=1)
    fail = iter([True])
    t.host_alloc_fail = lambda: next(fail, False)  # the first host allocation fails
    first = t.insert([1, 2, 3])
    assert first.writes == [] and first.backups_failed == 1 and t.host_used == 0
    second = t.insert([1, 2, 3, 4])  # [1,2,3] reaches its hit threshold, the new leaf too
    top, leaf = node_at(t, [1, 2, 3]), node_at(t, [1, 2, 3, 4])
    assert [(w.ack_id, w.tokens) for w in second.writes] == [(top.id, 3), (leaf.id, 1)]
    assert second.writes == [t.pending_writes[top.id], t.pending_writes[leaf.id]]
    assert second.node is leaf and second.backups_failed == 0
    for w in second.writes:
        t.finish_write_through(w.ack_id)
    t.check()


def test_write_through_insert_reports_the_host_eviction_its_backup_ran():
    t = Tree(device_capacity=32, host_capacity=3, write_policy="write_through", load_back_threshold=1)
    for w in t.insert([1, 2, 3]).writes:
        t.finish_write_through(w.ack_id)
    t.evict_device(3)  # demoted: [1,2,3] is a host-only H-leaf filling the host pool
    res = t.insert([7])
    assert [w.tokens for w in res.writes] == [1]
    assert (res.host.freed, res.host.lru_evicted, res.host.scanned) == (3, 3, 0)


# ------------------------------------------------------------------ device eviction
def test_write_back_eviction_with_tight_host_reports_backups_and_reclaim_scan():
    t = wb(host_capacity=5)
    t.insert([7])
    t.evict_device(1)  # [7]: backed up, demoted; its map entry goes stale (map: [S])
    t.insert([9, 9, 9])
    t.insert([9, 9, 9, 8])
    a = node_at(t, [9, 9, 9])
    t.backup_node(a)  # a settled duplicate (map: [S, A]); host 4 of 5
    t.inc_lock(node_at(t, [9, 9, 9, 8]))  # A internal and locked: pass 1 takes it
    t.insert([1])
    t.insert([2, 2])
    before = t.stats.as_dict()
    res = t.evict_device(3)
    assert isinstance(res, Eviction)
    # [1] fits the one free host token; [2, 2] needs a reclaim: the walk scans the
    # stale S, then releases A (3 tokens), and sweeps S afterwards.
    assert res.backups == [1, 2]
    assert (res.freed, res.demoted, res.deleted, res.dropped, res.declined) == (3, 3, 0, 0, 0)
    h = res.host
    assert (h.freed, h.reclaimed_pass1, h.reclaimed_pass2, h.lru_evicted) == (3, 3, 0, 0)
    assert h.scanned == res.reclaim_scanned == 2 and h.swept == 1
    assert not a.host
    assert delta(before, t) == {
        "backups": 2, "backup_tokens": 3, "demote_tokens": 3, "reclaims": 1,
        "reclaim_pass1_tokens": 3, "reclaim_scanned": 2, "swept": 1}
    t.check()


def test_eviction_reports_each_backup_in_order():
    t = wb(host_capacity=5)
    t.insert([1])
    t.insert([2, 2])
    res = t.evict_device(3)
    assert res.backups == [1, 2]


def test_declined_drop_and_failed_backup_are_counted():
    t = wb(device_capacity=32, host_capacity=4)
    t.insert([1, 2, 3, 4, 5, 6])  # 6 tokens never fit a 4-token host
    t.insert([9])
    x = node_at(t, [1, 2, 3, 4, 5, 6])
    t.match_prefix([9])
    holder = t.host_lock(x)
    res = t.evict_device(6)
    assert (res.backups_failed, res.declined, res.backups, res.freed) == (1, 1, [1], 1)
    t.host_unlock(holder)
    res = t.evict_device(6)
    assert (res.backups_failed, res.dropped, res.dropped_host, res.freed) == (1, 6, 0, 6)


def test_drop_reports_the_host_only_subtree_it_deleted():
    t = wb(device_capacity=32, host_capacity=16)
    t.insert([1, 2, 3])
    t.insert([1, 2, 3, 4, 5])
    t.evict_device(2)  # [4, 5]: backed up and demoted, host-only below [1, 2, 3]
    t.host_alloc_fail = lambda: True  # the parent's backup fails: drop it
    res = t.evict_device(3)
    assert (res.dropped, res.dropped_host, res.backups_failed, res.freed) == (3, 2, 1, 3)
    assert t.n_nodes == 0


def test_write_through_eviction_reports_deletes():
    t = Tree(device_capacity=16, host_capacity=2, write_policy="write_through", load_back_threshold=1)
    t.insert([5, 5, 5])  # no host room: not backed up
    res = t.evict_device(1)
    assert (res.freed, res.deleted, res.demoted, res.backups) == (3, 3, 0, [])


def test_nothing_to_do_returns_empty_results():
    t = wb()
    ev, he = t.evict_device(0), t.evict_host(5)
    assert (ev.freed, ev.backups, ev.host.freed, ev.reclaim_scanned) == (0, [], 0, 0)
    assert isinstance(he, HostEviction) and he.freed == 0 and he is not NO_HOST_EVICTION
    with pytest.raises(AttributeError):
        ev.host.freed = 1  # the shared empty HostEviction is read-only


# ------------------------------------------------------------------ host eviction
def test_host_eviction_reports_each_pass_and_the_lru_walk():
    t = wb()
    t.insert([8, 8, 8])
    t.evict_device(3)  # backup + demote: a host-only H-leaf, its map entry stale
    t.insert([1, 2, 3, 4])
    t.insert([1, 2, 3, 4, 5, 6])
    t.evict_device(6)
    t.finish_load_back(t.load_back(t.match_prefix([1, 2, 3, 4, 5, 6]), "x").load.lid)
    # map: [8,8,8] (stale), [5,6] (an evictable D-leaf), [1,2,3,4] (internal)
    res = t.evict_host(2)  # pass 1 scans the stale entry, spares [5,6], takes [1..4]
    assert (res.freed, res.reclaimed_pass1, res.reclaimed_pass2, res.lru_evicted) == (4, 4, 0, 0)
    assert (res.scanned, res.swept) == (3, 1)
    res = t.evict_host(3)  # pass 1 spares [5,6]; pass 2 takes it; the LRU walk takes [8,8,8]
    assert (res.freed, res.reclaimed_pass1, res.reclaimed_pass2, res.lru_evicted) == (5, 0, 2, 3)
    assert (res.scanned, res.swept) == (2, 0)
    t.check()


def test_reclaim_returns_its_own_result_and_never_touches_stats():
    t = wb()
    t.insert([1, 1])
    t.insert([1, 1, 2])
    t.backup_node(node_at(t, [1, 1]))
    before = t.stats.as_dict()
    r = t.host_policy.reclaim(t, 1)
    assert isinstance(r, Reclaim) and (r.freed, r.pass1, r.pass2, r.scanned, r.swept) == (2, 2, 0, 1, 0)
    # the release itself books its tokens; the scan count is evict_host's to book
    assert delta(before, t) == {"reclaims": 1, "reclaim_pass1_tokens": 2}


# ------------------------------------------------------------------ load-back
def test_load_back_ok_reports_load_tokens_and_anchor():
    t = wb()
    t.insert([1, 2, 3])
    t.evict_device(3)
    m = t.match_prefix([1, 2, 3])
    res = t.load_back(m, "a")
    assert isinstance(res, LoadResult)
    assert (res.ok, res.reason, res.tokens, res.eviction) == (True, None, 3, None)
    assert res.load is t.loads["a"] and res.anchor is m.best is res.load.anchor


def test_load_back_that_evicts_then_fails_still_reports_its_eviction():
    t = wb(device_capacity=8, host_capacity=16)
    t.insert([1, 2, 3, 4])
    t.evict_device(4)  # host-only now
    t.insert([5, 5, 5, 5, 5])
    t.inc_lock(node_at(t, [5] * 5))
    t.insert([6, 6])  # the one evictable D-leaf: 2 tokens, no host copy
    before = t.stats.as_dict()
    res = t.load_back(t.match_prefix([1, 2, 3, 4]), "b")  # needs 4, 1 free
    assert (res.ok, res.reason, res.tokens, res.load, res.anchor) == (False, "no_device_space", 0, None, None)
    ev = res.eviction
    assert ev.backups == [2] and ev.freed == ev.demoted == 2
    assert delta(before, t) == {"backups": 1, "backup_tokens": 2, "demote_tokens": 2}
    t.check()


@pytest.mark.parametrize("reason", ["no_host_tail", "below_threshold"])
def test_load_back_rejections_carry_no_eviction(reason):
    t = wb(load_back_threshold=3)
    t.insert([1, 2, 3, 4])
    if reason == "below_threshold":
        t.evict_device(4)
        t.match_prefix([1])  # a 1-token host-only fragment
    res = t.load_back(t.match_prefix([1] if reason == "below_threshold" else [1, 2, 3, 4]), "c")
    assert (res.ok, res.reason, res.tokens, res.eviction) == (False, reason, 0, None)


# ------------------------------------------------------------------ equivalence
# Counters no result field mirrors: ``reclaims`` (the number of released duplicates;
# their tokens are the pass fields) and ``unevict_tokens`` (part of an insert's
# ``new_device_tokens``).
UNMIRRORED = ("reclaims", "unevict_tokens")


def host_implied(h: HostEviction, out: dict) -> None:
    for counter, value in (("reclaim_pass1_tokens", h.reclaimed_pass1),
                           ("reclaim_pass2_tokens", h.reclaimed_pass2),
                           ("reclaim_scanned", h.scanned), ("swept", h.swept),
                           ("host_evict_tokens", h.lru_evicted)):
        out[counter] = out.get(counter, 0) + value
    assert h.freed == h.reclaimed_pass1 + h.reclaimed_pass2 + h.lru_evicted


def eviction_implied(e: Eviction, out: dict) -> None:
    assert e.freed == e.demoted + e.deleted + e.dropped
    for counter, value in (("demote_tokens", e.demoted), ("delete_tokens", e.deleted),
                           ("drop_tokens", e.dropped), ("drop_host_tokens", e.dropped_host),
                           ("drop_declined", e.declined), ("backups", len(e.backups)),
                           ("backup_tokens", sum(e.backups)),
                           ("backup_failures", e.backups_failed)):
        out[counter] = out.get(counter, 0) + value
    out["drops"] = out.get("drops", 0) + (1 if e.dropped else 0)  # a flag: see check_op
    host_implied(e.host, out)


def check_op(tree, kind, res, before, dev0, host0):
    got = delta(before, tree)
    want: dict = {}
    if kind in ("match", "lock", "load_back"):
        m = res[0]
        want["splits"] = int(m.split)
        res = res[1]
    if kind == "insert":
        want["splits"] = int(res.split)
        want["backups"] = len(res.writes)
        want["backup_tokens"] = sum(w.tokens for w in res.writes)
        want["backup_failures"] = res.backups_failed
        host_implied(res.host, want)
        assert tree.dev_used - dev0 == res.new_device_tokens
    elif kind == "evict_device":
        eviction_implied(res, want)
        assert dev0 - tree.dev_used == res.freed
    elif kind == "evict_host":
        host_implied(res, want)
        assert host0 - tree.host_used == res.freed
    elif kind == "load_back":
        want["load_tokens"] = res.tokens
        if res.eviction is not None:
            eviction_implied(res.eviction, want)
        if not res.ok:
            assert res.tokens == 0 and res.load is None and res.anchor is None
    # ``drops`` counts victims, not tokens: check it is implied whenever tokens were
    # dropped, and compare the rest exactly.
    drops = got.pop("drops", 0)
    want_drops = want.pop("drops", 0)
    assert (drops > 0) == bool(want_drops)
    for name in UNMIRRORED:
        got.pop(name, None)
    want = {k: v for k, v in want.items() if v}
    assert got == want, kind


def replay_checking(ops):
    """Drive a tree through an op-trace (header first) as the reference replayer
    does, checking every op's result object against the stats counters."""
    r = Replayer(ops[0])
    tree = r.tree
    tree.rec = None  # the engine's configuration: no event recording
    locks = {}
    for op in ops[1:]:
        kind = op["op"]
        tree.reserved = op.get("reserved", 0)
        before, dev0, host0 = tree.stats.as_dict(), tree.dev_used, tree.host_used
        key = r.units(op["tokens"]) if "tokens" in op else None
        res = None
        if kind == "insert":
            try:
                res = tree.insert(key)
            except TreeError:
                assert delta(before, tree) == {}
                continue
        elif kind == "match":
            res = (tree.match_prefix(key), None)
        elif kind == "evict_device":
            res = tree.evict_device(op["n"])
        elif kind == "evict_host":
            res = tree.evict_host(op["n"])
        elif kind == "load_back":
            if op["id"] in tree.loads:
                continue
            m = tree.match_prefix(key)
            res = (m, tree.load_back(m, op["id"]))
        elif kind == "load_back_ack":
            if op["id"] in tree.loads:
                tree.finish_load_back(op["id"])
        elif kind == "lock":
            if op["id"] in locks:
                continue
            m = tree.match_prefix(key)
            tree.inc_lock(m.last_device)
            locks[op["id"]] = m.last_device
            res = (m, None)
        elif kind == "unlock":
            if op["id"] in locks:
                tree.dec_lock(locks.pop(op["id"]))
        elif kind == "skip_ids":
            tree.skip_ids(op["n"])
        if res is not None:
            check_op(tree, kind, res, before, dev0, host0)
        elif kind not in ("match", "lock"):
            assert delta(before, tree) == {}, kind
        for ack in list(tree.pending_writes):  # the reference replayer's ack rule
            tree.finish_write_through(ack)
    tree.check()
    return tree


CASES = conformance_cases()


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_results_account_for_stats_on_conformance_cases(case):
    replay_checking([op for _, _, op in read_trace(case)])


@pytest.mark.parametrize("ps", [1, 4])
@pytest.mark.parametrize("policy", ["write_back", "write_through"])
@pytest.mark.parametrize("seed", range(3))
def test_results_account_for_stats_on_generated_traces(seed, policy, ps):
    ops = generate(600, seed=seed, page_size=ps, device_capacity=32 * ps, host_capacity=10 * ps,
                   write_policy=policy)
    replay_checking(ops)
