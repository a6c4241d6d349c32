"""The unified core with FULL alone (``HybridTree(NoComponent())``, SGLang 0.5.23's
``UnifiedTreeCore`` with ``components=(FULL,)``) behind the FULL replica interface
the engine drives (``sim.replica_api.FullReplica``).

Nothing of the tree's behaviour is here: every op is the core's
(``sim/tree/hybrid.py``, its FULL component ``sim/tree/components/full.py``). This
class only gives the core the engine's names for what it already does:

* locks without receipts: with no auxiliary component a device lock is the FULL
  path lock alone, so the node itself is the receipt (``inc_lock`` returns it);
* ``evict_device(n)``, ``evict_host(n)``, ``host_lock`` / ``host_unlock``,
  ``finish_write_through``, ``load_back(match, lid)`` with a ``LoadResult``;
* ``insert(key, priority, resident, inserted)``: the request's reused prefix is
  what the device already holds of the key (``match_full_device_prefix``);
* the engine-side hooks and ledgers (``reserved``, the storage and buffer_only
  hooks, host skew, a scripted fault's ``digest_xor``), and ``lock_in`` for forks.
"""

from __future__ import annotations

from sim import constants as C
from sim.policies import resolve
from sim.policies.write import WRITE_POLICIES
from sim.tree.components.none import NoComponent
from sim.tree.core import RUST_ID_SCHEMES
from sim.tree.hybrid import HybridTree, host_field
from sim.tree.results import (
    _REJECTED,
    NO_HOST_EVICTION,
    Backup,
    Eviction,
    HostEviction,
    LoadResult,
)


class Tree(HybridTree):
    """One rank's FULL radix tree under HiCache: the unified core with no auxiliary
    component (module docstring). Always built with a host tier (``host_capacity`` 0
    is a host pool with no room: a write_back victim's backup then fails and it is
    dropped, as SGLang's is)."""

    _full_backups = True

    def __init__(self, *, device_capacity: int, host_capacity: int, page_size: int = 1,
                 write_policy: str = "write_back", host_policy: str = "duplicate_first",
                 eviction_policy: str = "lru",
                 load_back_threshold: int = C.LOAD_BACK_THRESHOLD, ids: str = "optrace",
                 record: bool = False):
        self.write = resolve(WRITE_POLICIES, write_policy, "write policy")
        super().__init__(NoComponent(), device_capacity=device_capacity, aux_capacity=0,
                         page_size=page_size, record=record, host_capacity=host_capacity,
                         load_back_threshold=load_back_threshold, write_policy=write_policy,
                         host_policy=host_policy, eviction_policy=eviction_policy, ids=ids)
        self.ids = ids
        self.rust_core = ids in RUST_ID_SCHEMES
        # XORed into the digest a rank reports (a scripted digest-only fault, sim.faults)
        self.digest_xor = 0

    # ------------------------------------------------------------- ledgers
    host_capacity = host_field("host_capacity", "a host-skewed rank's is set at t=0 (sim.ranks)")
    host_alloc_fail = host_field("host_alloc_fail", "a rank's scripted host allocation failures")
    on_host_backup = host_field("on_host_backup", "the storage tier's write hook")
    buffer_only = host_field("buffer_only", "--hicache-host-memory-mode buffer_only")
    host_reserved = property(lambda self: self.ht.host_reserved,
                             doc="host slots staged prefetches hold (``stage_host``)")
    host_free = property(lambda self: self.ht.host_capacity - self.ht.host_used
                         - self.ht.host_reserved,
                         doc="host slots neither in the tree nor staged")
    pending_writes = property(lambda self: self.ht.writes,
                              doc="write_through / buffer_only D->H writes in flight, by ack id")

    # ------------------------------------------------------------- locks
    def inc_lock(self, node, skip_aux: bool = False):
        """FULL's path lock (core ``inc_lock_ref`` with FULL alone); the node is the
        receipt. The lock walk takes every device node it locks out of the device
        leaf set; only a host-only anchor (a load-back's) has a leaf set left to
        leave, which the core's refresh of the anchor does."""
        self.full.acquire_lock(node)
        if not node.dev:
            self._refresh(node)
        return node

    def dec_lock(self, node) -> None:
        """core ``dec_lock_ref`` with FULL alone: the unlock walk refreshes every node
        whose last lock it releases, the anchor's refresh after it has nothing left
        to change."""
        self.full.release_lock(node)

    @staticmethod
    def _receipt_node(node):
        return node

    @staticmethod
    def _receipt_copy(node, nmap: dict):
        return nmap[id(node)]

    host_lock = HybridTree.inc_host_lock
    host_unlock = HybridTree.dec_host_lock

    # ------------------------------------------------------------- ops
    def insert(self, key: list, priority: int = 0, resident: bool = False,
               inserted: int = 0):
        """core ``insert`` for a request whose fresh KV starts where the device's
        copy of ``key`` ends (``resident``: the caller knows the whole key is on
        device, so that walk is skipped). Raises ``TreeError("device_full")``,
        changing nothing, when the new tokens do not fit: inserts never evict."""
        prev = len(key) if resident else self.device_prefix(key)[0]
        return HybridTree.insert(self, key, prev * self.page_size, inserted, priority=priority)

    def evict_device(self, n: int) -> Eviction:
        """Free at least ``n`` device tokens (cache ``evict`` for FULL)."""
        return self.evict(n, 0)

    def evict_host(self, n: int) -> HostEviction:
        """core ``drive_host_eviction(FULL, n)``: the duplicate reclaim first
        (write_back), then host leaves by priority (buffer_only: nothing)."""
        res = Eviction()
        if n > 0 and not self.ht.buffer_only:
            self._evict_host(n, res)
        return HostEviction() if res.host is NO_HOST_EVICTION else res.host

    def load_back(self, match, lid) -> LoadResult:
        """cache ``init_load_back`` + ``load_back`` as a ``LoadResult``."""
        r = HybridTree.load_back(self, match, lid)
        if r.started:
            return LoadResult(None, self.ht.loads[lid], r.eviction)
        if r.eviction is None and r.reason in _REJECTED:
            return _REJECTED[r.reason]
        return LoadResult(r.reason, None, r.eviction)

    finish_write_through = HybridTree.write_ack

    def backup_node(self, x) -> Backup:
        """cache ``backup_node_for_write_back``: the blocking single-node D->H backup
        of a write_back eviction victim without the demote, leaving ``x`` a settled
        duplicate (sem §3.3)."""
        res = Backup()
        if x.host or not x.dev:
            res.ok = x.host
            return res
        w = self._write_backup(x, res)
        if w is None:
            self.stats.backup_failures += 1
        else:
            res.ok, res.tokens = True, w[0]
        return res

    # ------------------------------------------------------------- forks
    def lock_in(self, node):
        """The node of this tree, a clone, at the path of ``node`` (a lock held on the
        tree it was cloned from): a fork moves a running request's lock with this.
        The clone has the same nodes, so the walk lands on a node boundary."""
        path = self.path_units(node)
        x, pos = self.root, 0
        while pos < len(path):
            x = x.children[path[pos]]
            pos += len(x.key)
        return x

    def clone(self, maps: dict | None = None) -> "Tree":
        """``HybridTree.clone``; the rank-local hooks stay with the original (a
        fork's rank gets its own: sim.ranks, sim.faults, its storage book)."""
        new = HybridTree.clone(self, maps)
        new.ht.host_alloc_fail = None
        new.ht.on_host_backup = None
        for name in ("host_skew_fired", "on_backup_intent", "buffer_walk", "_evict_host",
                     "release_duplicate"):
            new.__dict__.pop(name, None)
        return new
