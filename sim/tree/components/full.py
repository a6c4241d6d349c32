"""The FULL component of a hybrid tree (``sim/tree/hybrid.py``), after SGLang 0.5.23's
``unified_cache/components/full.py`` ``FullComponent``: its path locks and its leaf
eviction on device and host by the eviction policy's priority
(``tree_core.eviction_strategy.get_priority``).

FULL's values are the node's ``dev``/``host`` flags and ``len(key) * page_size``
tokens; its ledgers (``dev_used``, ``evictable``, ``protected``, the host pool's
``host_used``) and leaf sets (``d_leaves``, ``ht.h_leaves``) are the core's, as
``UnifiedTreeCore``'s ``component_evictable_size_[FULL]`` and
``evictable_device_leaves`` are. Its split (``redistribute_on_node_split``) stays
inline in the core's ``_split``, the hottest walk step.
"""

from __future__ import annotations

import heapq

from sim.errors import InvariantError
from sim.policies import resolve
from sim.policies.eviction import EVICTION_POLICIES
from sim.tree.components.base import Discard
from sim.tree.results import HostLockReceipt

# The default eviction priority, which the leaf heaps read inline (``leaf_heap``).
_LRU_PRIORITY = EVICTION_POLICIES["lru"]


class FullComponent:
    """full ``FullComponent``: ``tree`` is the core; ``prio`` the eviction policy's
    priority of a leaf (``eviction_strategy.get_priority``). Not a
    ``TreeComponent``: FULL is the core's base component (core
    ``BASE_COMPONENT_TYPE``), whose values, ledgers and leaf sets are the core's, with
    no LRU list of its own (it evicts by ``last_access_time``), so it carries only
    the hooks the core calls on it."""

    __slots__ = ("tree", "prio")

    name = "full"

    def __init__(self, eviction_policy: str = "lru"):
        self.tree = None
        self.prio = resolve(EVICTION_POLICIES, eviction_policy, "eviction policy")

    def attach(self, tree) -> None:
        self.tree = tree

    # ------------------------------------------------------------------ locks
    def acquire_lock(self, node) -> None:
        """full ``acquire_component_lock``: the bottom device-evicted segment is
        locked too, with no ledger move (host tier only: a load-back's anchor), then
        every node up to the root, the first lock of each moving its tokens from
        evictable to protected."""
        t = self.tree
        cur, root, ps = node, t.root, t.page_size
        while cur is not root and not cur.dev:
            cur.lock += 1
            cur = cur.parent
        d_leaves = t.d_leaves
        while cur is not root:
            if cur.lock == 0:
                n = len(cur.key) * ps
                t.evictable -= n
                t.protected += n
            cur.lock += 1
            d_leaves.discard(cur)
            cur = cur.parent

    def release_lock(self, node) -> None:
        """full ``release_component_lock``: every node up to the root, the last
        unlock of a node on device moving its tokens back to evictable."""
        t = self.tree
        cur, root, ps = node, t.root, t.page_size
        while cur is not root:
            if cur.lock <= 0:
                raise InvariantError(f"FULL release hit lock_ref=0 on node {cur.id}")
            if cur.lock == 1 and cur.dev:
                n = len(cur.key) * ps
                t.evictable += n
                t.protected -= n
            cur.lock -= 1
            if cur.lock == 0:
                t._refresh(cur)
            cur = cur.parent

    # ------------------------------------------------------------------ eviction
    def leaf_heap(self, leaves) -> list:
        """A heap of ``leaves`` by the eviction policy's priority, ties by node id
        (``eviction_strategy.get_priority``): rebuilt at the start of each walk, so
        it costs one entry per leaf; ``lru``'s priority (the default) is read inline,
        a slot read being cheaper than a getter's call."""
        prio = self.prio
        if prio is _LRU_PRIORITY:
            heap = [(n.last_access, n.id, n) for n in leaves]
        else:
            heap = [(prio(n), n.id, n) for n in leaves]
        heapq.heapify(heap)
        return heap

    def evict_device(self, request: int, res) -> None:
        """full ``_evict_device_start`` / ``_evict_device_next_node``: a heap of the
        device leaves by priority; a victim's parent joins when it becomes a leaf.
        Each victim is the core's: ``_delete_leaf`` with HiCache off,
        ``_evict_dleaf`` with it on (cache ``_evict_components``' write_back
        branch)."""
        t = self.tree
        act = t._evict_dleaf if t.hicache else t._delete_leaf
        prio = self.prio
        d_leaves = t.d_leaves
        heap = self.leaf_heap(d_leaves)
        last = None
        while True:
            if last is not None and last.parent is not None and last.parent in d_leaves:
                p = last.parent
                heapq.heappush(heap, (p.last_access if prio is _LRU_PRIORITY else prio(p),
                                      p.id, p))
            last = None
            x = None
            while res.freed < request and heap:
                _, _, cand = heapq.heappop(heap)
                if cand in d_leaves:
                    x = cand
                    break
            if x is None:
                return
            last = x
            act(x, res)

    def drive_host_eviction(self, n: int, op) -> int:
        """core ``drive_host_eviction`` for FULL: the host policy's duplicate reclaim
        first (``_reclaim_full_host_duplicates`` by default: two passes, pass 1
        sparing evictable D-leaves; only FULL's host copy goes, the component's
        stays), then full ``drive_host_eviction`` over the host leaves by priority,
        sharing one counter. ``op``: the result of the op that needed the room,
        whose ``host`` it is added to, with the duplicate-map entries the reclaim
        visited (``scanned``, which the engine charges): core
        ``_reclaim_full_host_duplicates`` stops its walk as soon as enough is
        freed, so a reclaim costs the entries it reached, not the whole map."""
        t = self.tree
        ht = t.ht
        freed = 0
        # drive_host_eviction: the duplicate reclaim runs under write_back only.
        policy = ht.host_policy
        if not ht.wt and policy.reclaims and not t.skip_reclaim:
            r = policy.reclaim(t, n)
            # most reclaims scan a few entries, free nothing and meet no stale one
            if r.scanned:
                he = t._host_of(op)
                he.scanned += r.scanned
                t.stats.reclaim_scanned += r.scanned
                freed = r.freed
                if freed:
                    he.reclaimed_pass1 += r.pass1
                    he.reclaimed_pass2 += r.pass2
                if r.swept:
                    he.swept += r.swept
        lru = 0
        if freed < n:
            # the leaf walk, when the reclaim left some to free
            prio = self.prio
            h_leaves = ht.h_leaves
            heap = self.leaf_heap(h_leaves)
            res = Discard()
            while freed < n and heap:
                _, _, x = heapq.heappop(heap)
                if x not in h_leaves:
                    continue
                k = t._evict_hleaf(x, res)[0]
                freed += k
                lru += k
                p = x.parent
                if p is not None and p in h_leaves:
                    heapq.heappush(heap, (p.last_access if prio is _LRU_PRIORITY else prio(p),
                                          p.id, p))
        if freed:
            he = t._host_of(op)
            he.freed += freed
            he.lru_evicted += lru
        return freed

    # ------------------------------------------------------------- host locks
    def acquire_host_lock(self, anchor):
        """full ``acquire_component_lock(lock_host=True)``: only the anchor is pinned,
        a one-node segment whose boundary mark (``metadata["host_uuid"]``) a split
        moves up; write_through pins only an anchor with a FULL host copy
        (write_back a device-only one too). Returns the receipt."""
        t = self.tree
        full = anchor.host or not t.ht.wt
        holder = HostLockReceipt(anchor, full)
        if full:
            anchor.host_lock += 1
            t._mark_host_top(anchor, holder)
            t._refresh(anchor)
        return holder

    def release_host_lock(self, holder) -> None:
        """full ``release_component_lock(lock_host=True)``: -1 from the anchor up to
        the boundary mark (write_through stops at a node without a host copy)."""
        t = self.tree
        wt = t.ht.wt
        node = holder.anchor
        while True:
            if wt and not node.host:
                break
            node.host_lock -= 1
            t._refresh(node)
            if node is holder.top:
                break
            node = node.parent
        t._unmark_host_top(holder)
