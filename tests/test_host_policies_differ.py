"""duplicate_first and duplicate_first_single_pass can take different victims.

A capacity sweep gave them identical hit rates at every point, so the suite shows,
on the tree itself, when they part and when they cannot: duplicate_first's pass 1
spares duplicates that are evictable D-leaves (pass 2 takes them if pass 1 fell
short); the single pass takes every duplicate in map order. They differ whenever an
evictable D-leaf duplicate is reached, in map order, before the reclaim is covered;
with no D-leaf duplicate in the way they take the same victims, whether or not
duplicate_first's pass 2 runs. reports/identical.py words its reason to match.

Checked through node state and the tree's counters, not return values."""

import pytest

from test_tree import node_at, settle, wb


def _leaf_first(policy):
    """Duplicates registered as [b, a]: b = [5, 6] an evictable D-leaf (2 tokens),
    a = [1..4] internal (4 tokens), both on device and host (page size 1)."""
    t = wb(host_policy=policy)
    t.insert([1, 2, 3, 4])
    t.insert([1, 2, 3, 4, 5, 6])
    settle(t, [1, 2, 3, 4, 5, 6])
    a, b = node_at(t, [1, 2, 3, 4]), node_at(t, [1, 2, 3, 4, 5, 6])
    assert list(t.dups) == [b.id, a.id] and b in t.d_leaves and a not in t.d_leaves
    return t, a, b


def _outcome(t, a, b):
    s = t.stats
    return {"a_host": a.host, "b_host": b.host, "pass1": s.reclaim_pass1_tokens,
            "pass2": s.reclaim_pass2_tokens, "host_used": t.host_used}


def test_a_d_leaf_first_in_map_order_parts_them_without_pass_2():
    df = _leaf_first("duplicate_first")
    sp = _leaf_first("duplicate_first_single_pass")
    for t, _, _ in (df, sp):
        t.evict_host(1)
    # duplicate_first spares the D-leaf b and releases a; the single pass releases b
    assert _outcome(*df) == {"a_host": False, "b_host": True, "pass1": 4, "pass2": 0,
                             "host_used": 2}
    assert _outcome(*sp) == {"a_host": True, "b_host": False, "pass1": 2, "pass2": 0,
                             "host_used": 4}
    for t, _, _ in (df, sp):
        t.check()


@pytest.mark.parametrize("need, pass2", [(1, 0), (5, 2)])
def test_with_no_d_leaf_in_the_way_they_take_the_same_victims(need, pass2):
    """Duplicates registered as [a, b] (internal first): both release a first; when a
    is not enough, duplicate_first's pass 2 takes b and the single pass takes it next
    in map order: the same victims, only the pass they are counted in differs."""
    runs = {}
    for policy in ("duplicate_first", "duplicate_first_single_pass"):
        t = wb(host_policy=policy)
        t.insert([1, 2, 3, 4])
        settle(t, [1, 2, 3, 4])  # a: loaded back, a duplicate first
        t.insert([1, 2, 3, 4, 5, 6])
        t.backup_node(node_at(t, [1, 2, 3, 4, 5, 6]))  # b: backed up, a duplicate next
        a, b = node_at(t, [1, 2, 3, 4]), node_at(t, [1, 2, 3, 4, 5, 6])
        assert list(t.dups) == [a.id, b.id] and b in t.d_leaves
        t.evict_host(need)
        runs[policy] = _outcome(t, a, b)
    df, sp = runs["duplicate_first"], runs["duplicate_first_single_pass"]
    assert (df["a_host"], df["b_host"], df["host_used"]) == \
        (sp["a_host"], sp["b_host"], sp["host_used"])
    assert df["pass2"] == pass2 and sp["pass2"] == 0
    assert df["pass1"] + df["pass2"] == sp["pass1"]
