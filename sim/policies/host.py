"""Host-pressure policies: which host copies go first when the host pool is short.

A policy's ``reclaim(tree, n)`` runs at the start of every write_back host eviction
(``Tree.evict_host``), before the H-leaf LRU walk, and returns the host tokens it
freed. The LRU walk then continues with the same counter (sem §3.4).
"""

from __future__ import annotations


class HostPolicy:
    """Base: no duplicate reclaim (SGLANG_HICACHE_SKIP_HOST_DUPLICATE_RECLAIM=1)."""

    name = "lru"
    reclaims = False

    def reclaim(self, tree, n: int) -> int:
        return 0


class DuplicateFirst(HostPolicy):
    """SGLang PR #33777 `_reclaim_full_host_duplicates` (sem §4), exactly.

    Two passes over the insertion-ordered duplicate map. Pass 1 spares duplicates
    that are evictable D-leaves (a device eviction would demote them for free, so
    their host copy is the cheap way to evict them later); pass 2 takes them too.
    Stale entries the walk reaches are swept after both passes.
    """

    name = "duplicate_first"
    reclaims = True
    passes: tuple[int, ...] = (1, 2)
    spare_dleaves = True

    def entries(self, tree):
        return tree.dups.values()

    def reclaim(self, tree, n: int) -> int:
        freed = 0
        stale: dict = {}  # node id -> (map position, node): swept after the walk
        released = []
        d_leaves = tree.d_leaves
        scanned = 0
        for pass_no in self.passes:
            if freed >= n:
                break
            spare = self.spare_dleaves and pass_no == 1
            for pos, node in enumerate(self.entries(tree)):
                if freed >= n:
                    break
                scanned += 1
                if not (node.dev and node.host):
                    if node.id not in stale:
                        stale[node.id] = (pos, node)
                    continue
                if spare and node in d_leaves:
                    continue
                if node.lb_pending is not None or node.wt_pending is not None or node.host_lock_ref:
                    continue  # live re-check: pinned or host-locked entries stay
                freed += tree._release_duplicate(node, pass_no)
                released.append(node)
        tree.stats.reclaim_scanned += scanned
        for node in released:
            tree.dups.pop(node.id, None)
            stale.pop(node.id, None)  # released in pass 1, seen again as stale in pass 2
        if stale:
            tree._sweep(node for _, node in sorted(stale.values(), key=lambda e: e[0]))
        return freed


class DuplicateFirstSinglePass(DuplicateFirst):
    """One pass in map order that does not spare D-leaves: measures what pass 1 buys."""

    name = "duplicate_first_single_pass"
    passes = (1,)
    spare_dleaves = False


class DuplicateFirstById(DuplicateFirst):
    """Two passes in ascending node-id order, the order one upstream test expects
    (sem §8 item 13); insensitive to registration order, not to id drift."""

    name = "duplicate_first_by_id"

    def entries(self, tree):
        return [tree.dups[i] for i in sorted(tree.dups)]


HOST_POLICIES = {
    cls.name: cls
    for cls in (HostPolicy, DuplicateFirst, DuplicateFirstSinglePass, DuplicateFirstById)
}
