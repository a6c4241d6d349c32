"""One core: the FULL tree is ``HybridTree(NoComponent())``, SGLang 0.5.23's
``UnifiedTreeCore`` with ``components=(FULL,)``.

``sim/tree/full.py``'s ``Tree`` is the core with no auxiliary component
(sim/tree/components/none.py) under the engine's names; the conformance tests
(tests/test_conformance.py, test_storage_conformance.py, test_buffer_conformance.py,
test_tree_core.py for the Rust core) replay every vendored FULL case on it. What is
here: that it is that core and nothing else, that the component holds nothing, the
one trace whose outputs come from SGLang for the lfu write_through case, and the
accounting every eviction result must satisfy.
"""

import random

import pytest

from conftest import ROOT, conformance_cases, expected_lines
from sim import jsonl
from sim.optrace import Replayer, read_trace, replay_lines
from sim.optrace_gen import generate
from sim.tree import Tree
from sim.tree.components.none import NoComponent
from sim.tree.hybrid import HybridTree

ONE_CORE = ROOT / "tests" / "data" / "one_core"


def test_the_full_tree_is_the_core_with_no_component():
    t = Tree(device_capacity=8, host_capacity=8)
    assert isinstance(t, HybridTree) and type(t.aux) is NoComponent
    # no op of the core's own is replaced: Tree only adds the engine's names
    own = {"match_prefix", "evict", "_split", "_evict_dleaf", "_write_backup", "_demote",
           "_drop", "_release_layers", "finish_load_back", "stage_buffer_backup",
           "insert_host", "device_prefix"}
    assert not own & set(vars(Tree))


def test_the_null_component_holds_nothing():
    """A FULL-only workload leaves every auxiliary slot, ledger and list empty."""
    it = read_trace(conformance_cases()[-1])
    r = Replayer(next(it)[2])
    for idx, _, op in it:
        r.apply(idx, op)
    t = r.tree
    assert t.n_nodes > 0
    assert (t.aux_used, t.aux_evictable, t.aux_protected, t.aux_host_used) == (0, 0, 0, 0)
    assert t.lru.order() == [] and t.hlru.order() == []
    assert not any(x.aux or x.aux_lock or x.aux_host or x.aux_host_lock for x in t.iter_nodes())


def test_the_core_refuses_a_mid_node_prev_only_with_a_component_that_reads_it():
    """FULL alone takes a prev_prefix_len inside a node (the FULL tree passes the
    device prefix, which may end mid-node); SWA and Mamba refuse it (bad_prev)."""
    from sim.errors import TreeError
    from sim.tree.components.swa import SWATree

    t = HybridTree(NoComponent(), device_capacity=16, aux_capacity=0, host_capacity=16)
    t.insert([1, 2, 3, 4])
    r = t.insert([1, 2, 3, 5], prev=3)
    assert (r.prefix_len, r.new) == (3, 1)
    s = SWATree(device_capacity=16, swa_capacity=16, sliding_window=2)
    s.insert([1, 2, 3, 4])
    with pytest.raises(TreeError, match="bad_prev"):
        s.insert([1, 2, 3, 5], prev=3)


def test_lfu_write_through_follows_sglang():
    """tests/data/one_core: SGLang's outputs for an lfu write_through trace. An insert
    raises a walked leaf's hit count, lfu's priority, and SGLang's heap, built at
    each eviction's start (full.py ``_evict_device_start``), sees it."""
    case = ONE_CORE / "lfu_wt_s5.jsonl.gz"
    assert list(replay_lines(case)) == expected_lines(case)


# What an engine reads of an eviction besides ``freed`` (sim.tree.results), held to the
# tree's own ledgers op by op: a device eviction frees exactly what it demoted,
# deleted and dropped, a drop also frees its host-only subtree's host tokens, a host
# eviction frees exactly its two reclaim passes and its leaf walk, and every reclaim
# pass is a digest fold.
@pytest.mark.parametrize("seed", range(8))
def test_eviction_results_account_for_every_token(seed):
    rng = random.Random(seed)
    ps = (1, 2, 4, 1)[seed % 4]
    wp = ("write_back", "write_through")[seed % 4 == 3]
    ops = generate(300, seed=100 + seed, page_size=ps, device_capacity=32 * ps,
                   host_capacity=(16, 24, 64)[seed % 3] * ps, write_policy=wp,
                   mix={"insert": 500, "evict_device": 300, "evict_host": 270, "match": 230,
                        "load_back": 220, "dump": 40, "lock": 60})
    fails = sorted({(rng.randint(1, 300), 0) for _ in range(40)})
    header = dict(ops[0], host_policy=("duplicate_first", "lru")[seed % 2],
                  host_alloc_failures=[list(f) for f in fails])
    r = Replayer(header)
    t = r.tree
    seen = dict.fromkeys(("demoted", "deleted", "dropped", "dropped_host", "backups",
                          "pass1", "pass2", "lru", "scanned"), 0)
    for i, op in enumerate(ops[1:], 1):
        kind, n = op["op"], op.get("n", 0)
        r._op_index, r._attempt = i, 0
        dev, host, digest = t.dev_used, t.host_used, t.digest
        if kind == "evict_device" and n > 0:
            ev = t.evict_device(n)
            assert ev.freed == ev.demoted + ev.deleted + ev.dropped == dev - t.dev_used
            he = ev.host
            # backups went to host, then reclaims and leaf evictions made room for them
            assert t.host_used == host + sum(ev.backups) - he.freed - ev.dropped_host
            seen["backups"] += len(ev.backups)
        elif kind == "evict_host" and n > 0:
            he = t.evict_host(n)
            assert host - t.host_used == he.freed
        else:
            r.apply(i, op)
            continue
        assert he.freed == he.reclaimed_pass1 + he.reclaimed_pass2 + he.lru_evicted
        assert (t.digest != digest) == bool(he.reclaimed_pass1 + he.reclaimed_pass2)
        if wp == "write_through":
            assert he.scanned == 0  # the duplicate reclaim runs under write_back only
        t.check()
        for name, v in (("demoted", ev.demoted if kind == "evict_device" else 0),
                        ("deleted", ev.deleted if kind == "evict_device" else 0),
                        ("dropped", ev.dropped if kind == "evict_device" else 0),
                        ("dropped_host", ev.dropped_host if kind == "evict_device" else 0),
                        ("pass1", he.reclaimed_pass1), ("pass2", he.reclaimed_pass2),
                        ("lru", he.lru_evicted), ("scanned", he.scanned)):
            seen[name] += v
    # every part is exercised (duplicate_first reclaims, lru does not; write_through
    # deletes unbacked victims, write_back demotes and drops them)
    assert seen["lru"] > 0 and seen["demoted"] > 0
    if seed % 2 == 0 and wp == "write_back":
        assert seen["pass1"] + seen["pass2"] > 0 and seen["scanned"] > 0
    if wp == "write_through":
        assert seen["deleted"] > 0
    else:
        assert seen["backups"] > 0


def test_a_reclaim_costs_the_entries_it_visited():
    """core ``_reclaim_full_host_duplicates`` stops its walk once enough is freed: a
    host eviction that the map's first duplicate covers scans one entry, not the map."""
    t = Tree(device_capacity=64, host_capacity=64)
    for k in range(1, 9):
        t.insert([100 * k + j for j in range(4)])
    for k in range(1, 9):
        # the oldest unlocked leaf is key k: backed up and demoted (write_back), then
        # re-inserted on device, a duplicate; locked, so pass 1 does not spare it
        assert t.evict_device(4).backups == [4]
        t.inc_lock(t.insert([100 * k + j for j in range(4)]).node)
    assert len(t.dups) == 8
    he = t.evict_host(1)
    assert (he.reclaimed_pass1, he.scanned, len(t.dups)) == (4, 1, 7)
    # a walk that must pass the whole map to free enough scans all of it
    he = t.evict_host(4 * 7)
    assert (he.reclaimed_pass1, he.scanned, len(t.dups)) == (28, 7, 0)


def test_check_holds_the_tokens_on_both_tiers_and_the_content_hash():
    """The ledgers kept where FULL's residency flips (``_flip_dev`` / ``_flip_host``)
    are recomputed by ``check``: a counter or a running hash that drifts is named."""
    from sim.errors import InvariantError

    t = Tree(device_capacity=16, host_capacity=16)
    t.insert([1, 2, 3])
    t.backup_node(t.match_prefix([1, 2, 3]).best)
    assert t.dup_tokens == 3 and t.content_hash
    t.check()
    t.ht.dup_used += 1
    with pytest.raises(InvariantError, match="both tiers"):
        t.check()
    t.ht.dup_used -= 1
    t._hash ^= 1
    with pytest.raises(InvariantError, match="content hash"):
        t.check()
