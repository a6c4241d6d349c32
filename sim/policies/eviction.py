"""Heap priorities for device and host leaf eviction (`--radix-eviction-policy`, sem §2.3).

Each entry maps a node to its priority; the smallest is evicted first. SGLang breaks
exact ties by comparing nodes (by `last_access_time`) and then by heap layout, which
is address-dependent (sem §5.4.g); the tree breaks any remaining tie by node id, so
runs are deterministic.
"""

from operator import attrgetter

# attrgetter: the priority of a heap push (every recency stamp of a leaf) read in C,
# not through a Python call; (a, b) getters return the tuple (node.a, node.b).
_lru = attrgetter("last_access")
_lfu = attrgetter("hit_count", "last_access")
_fifo = attrgetter("creation")


def _mru(node):
    return -node.last_access


def _filo(node):
    return -node.creation


_priority = attrgetter("priority", "last_access")

# The policies whose priority reads a node's hit count, which a write_through insert
# raises on the nodes it walks (unified_tree_core.py ``_inc_hit_count_and_check``):
# a tree that keeps its leaf heaps across evictions re-pushes such a leaf then, as
# SGLang's heap, built at each eviction's start (full.py ``_evict_device_start``),
# sees the count it has by then.
READS_HIT_COUNT = frozenset({"lfu"})

EVICTION_POLICIES = {
    "lru": _lru,
    "lfu": _lfu,
    "fifo": _fifo,
    "mru": _mru,
    "filo": _filo,
    "priority": _priority,
}
