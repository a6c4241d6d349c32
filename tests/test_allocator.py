"""sim.allocator.KVAllocator: a replica's device KV held outside its tree, the only
writer of the replica's ``reserved`` ledger (FULL and hybrid)."""

import pytest

from conftest import ROOT
from sim.allocator import KVAllocator
from sim.errors import TreeError
from sim.runner import run_scenario
from sim.scenario import load_scenario
from sim.scheduler import available
from sim.tree import Tree


def test_alloc_free_and_a_late_free_move_the_ledger_the_tree_and_scheduler_read():
    tree = Tree(device_capacity=64, host_capacity=0, page_size=4)
    kv = KVAllocator(tree)
    kv.alloc(32)
    assert kv.reserved == tree.reserved == 32 and available(tree) == 32
    # the tree's own room check sees the held pages: 40 tokens no longer fit
    with pytest.raises(TreeError, match="device_full"):
        tree.insert(list(range(10)))
    kv.to_tree(8)
    assert tree.reserved == 24
    assert kv.issue_free() == 0 and kv.issue_free() == 1  # the draws' keys, in order
    kv.free_later(16)
    assert tree.reserved == 24 and kv.late == 16  # issued, not yet back
    kv.late_freed(16)
    assert tree.reserved == 8 and kv.late == 0
    kv.free(8)
    assert tree.reserved == 0
    assert tree.insert(list(range(10))).new_device_tokens == 40


def test_a_fork_gives_the_clone_its_own_allocator_with_the_same_counts():
    tree = Tree(device_capacity=64, host_capacity=0, page_size=1)
    kv = KVAllocator(tree)
    kv.alloc(10)
    kv.issue_free()
    kv.free_later(3)
    clone = tree.clone()
    new = kv.fork(clone)
    assert (new.tree, new.reserved, new.late, new.frees) == (clone, 10, 3, 1)
    new.free(4)
    assert (tree.reserved, clone.reserved) == (10, 6)


def test_on_a_hybrid_replica_the_held_tokens_shrink_the_trees_own_capacity():
    res = run_scenario(load_scenario(ROOT / "scenarios" / "hybrid_swa.yaml",
                                     ["workload.num_requests=4"]), None)
    c = res.sim.instances[0].group.cohorts[0]
    rep, kv = c.tree, c.kv
    assert kv.tree is rep and rep.reserved == 0
    cap = rep.t.device_capacity
    kv.alloc(2 * rep.page_size)
    assert rep.t.device_capacity == cap - 2 * rep.page_size
    kv.free(2 * rep.page_size)
    assert rep.t.device_capacity == cap
