"""Host-pressure policies: which host copies go first when the host pool is short.

A policy's ``reclaim(tree, n)`` runs at the start of every write_back host eviction
(``Tree.evict_host``), before the H-leaf LRU walk, and returns a ``Reclaim``: what
it freed and scanned, which the tree folds into the op's ``HostEviction`` at once.
The LRU walk then continues with the same counter (sem §3.4).

A reclaim is an internal step of a host eviction, and runs once per backup that
needs host room, so it allocates nothing: each policy instance (one per tree)
returns its own ``Reclaim``, overwritten by its next call.

Policies use only the tree's public host-policy API: ``duplicates()``,
``is_evictable_dleaf(node)``, ``reclaimable(node)``, ``release_duplicate(node,
pass_no)``, ``forget_duplicate(node)`` and ``sweep_stale(nodes)``.
"""

from __future__ import annotations


class Reclaim:
    """What one ``reclaim`` call did: ``freed == pass1 + pass2`` (host tokens released
    in each pass), ``scanned`` (map entries visited, over both passes) and ``swept``
    (stale entries removed). Valid until the policy's next ``reclaim``."""

    __slots__ = ("freed", "pass1", "pass2", "scanned", "swept")

    def __init__(self):
        self.freed = self.pass1 = self.pass2 = self.scanned = self.swept = 0

    def __repr__(self) -> str:
        return (f"Reclaim(freed={self.freed}, pass1={self.pass1}, pass2={self.pass2}, "
                f"scanned={self.scanned}, swept={self.swept})")


class HostPolicy:
    """Base: no duplicate reclaim (SGLANG_HICACHE_SKIP_HOST_DUPLICATE_RECLAIM=1)."""

    name = "lru"
    reclaims = False
    # per-call scratch, not state: two replicas that differ only here are the same
    # replica (sim.coalesce)
    scratch_fields = ("result",)

    def __init__(self):
        self.result = Reclaim()  # this policy's result, rewritten by every call
        self.nothing = Reclaim()  # the result of a reclaim with nothing to scan; never written

    def reclaim(self, tree, n: int) -> Reclaim:
        return self.nothing


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

    by_id = False  # walk in ascending node id instead of map order

    def reclaim(self, tree, n: int) -> Reclaim:
        # The map does not change during the walk (releases are forgotten after it),
        # so every pass walks the same entries.
        entries = tree.duplicates()
        if not entries:
            return self.nothing
        if self.by_id:
            entries = sorted(entries, key=_node_id)
        # The tree's API, looked up once per reclaim (on the tree, so that a test's or
        # a fault's patch of it is seen): the walk calls them once per entry.
        is_evictable_dleaf = tree.is_evictable_dleaf
        reclaimable = tree.reclaimable
        release = tree.release_duplicate
        freed = pass1 = pass2 = scanned = 0
        # Built on first use: most reclaims release nothing and meet no stale entry.
        # A later pass runs only when the first walked every entry, and then meets
        # the same stale entries again plus the ones it released, so the first pass
        # alone collects them, in map order.
        stale: list | None = None  # swept after the walk
        released: list | None = None
        first = True
        for pass_no in self.passes:
            if freed >= n:
                break
            spare = self.spare_dleaves and pass_no == 1
            before = freed
            for node in entries:
                if freed >= n:
                    break
                scanned += 1
                if not (node.dev and node.host):
                    if first:
                        if stale is None:
                            stale = [node]
                        else:
                            stale.append(node)
                    continue
                if spare and is_evictable_dleaf(node):
                    continue
                if not reclaimable(node):
                    continue  # live re-check: pinned or host-locked entries stay
                freed += release(node, pass_no)
                if released is None:
                    released = [node]
                else:
                    released.append(node)
            first = False
            if pass_no == 1:  # release_duplicate books any other pass as pass 2
                pass1 += freed - before
            else:
                pass2 += freed - before
        # The map must not change under the walk: forget and sweep after it.
        if released is not None:
            forget = tree.forget_duplicate
            for node in released:
                forget(node)
        swept = tree.sweep_stale(stale) if stale is not None else 0
        r = self.result
        r.freed = freed
        r.pass1 = pass1
        r.pass2 = pass2
        r.scanned = scanned
        r.swept = swept
        return r


class DuplicateFirstSinglePass(DuplicateFirst):
    """One pass in map order that does not spare D-leaves: measures what pass 1 buys."""

    name = "duplicate_first_single_pass"
    passes = (1,)
    spare_dleaves = False


class DuplicateFirstById(DuplicateFirst):
    """Two passes in ascending node-id order, the order one upstream test expects
    (sem §8 item 13); insensitive to registration order, not to id drift."""

    name = "duplicate_first_by_id"
    by_id = True


def _node_id(node) -> int:
    return node.id


HOST_POLICIES = {
    cls.name: cls
    for cls in (HostPolicy, DuplicateFirst, DuplicateFirstSinglePass, DuplicateFirstById)
}
