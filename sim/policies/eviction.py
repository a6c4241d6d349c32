"""Heap priorities for device and host leaf eviction (`--radix-eviction-policy`, sem §2.3).

Each entry maps a node to its priority; the smallest is evicted first. SGLang breaks
exact ties by comparing nodes (by `last_access_time`) and then by heap layout, which
is address-dependent (sem §5.4.g); the tree breaks any remaining tie by node id, so
runs are deterministic.
"""


def _lru(node):
    return node.last_access


def _lfu(node):
    return (node.hit_count, node.last_access)


def _fifo(node):
    return node.creation


def _mru(node):
    return -node.last_access


def _filo(node):
    return -node.creation


def _priority(node):
    return (node.priority, node.last_access)


EVICTION_POLICIES = {
    "lru": _lru,
    "lfu": _lfu,
    "fifo": _fifo,
    "mru": _mru,
    "filo": _filo,
    "priority": _priority,
}
