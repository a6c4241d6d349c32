"""The core of SGLang 0.5.23's unified radix tree (``UnifiedTreeCore``): FULL and one
auxiliary component (SWA or Mamba; ``NoComponent`` for FULL alone,
``components/none.py``, which ``sim/tree/full.py``'s ``Tree`` is), on device and, with a host pool, on host (HiCache, under
the write policies of ``sim/policies/write.py``; the storage tier's prefetch landing
and write hook, buffer_only).

This is the component-generic half of ``docs/HYBRID.md``: splits, the device and
host leaf sets, the ledgers, the eviction driver, backups, demotes, drops,
load-backs and the leaf deletion that cascades to every component. The components
are objects the core holds and calls, as SGLang's core loops over its components
(``sim/tree/components/``): ``full`` (``FullComponent``: FULL's path and host
locks, its leaf eviction on both tiers by the eviction policy's priority) and
``aux`` (a ``TreeComponent``: ``SWAComponent`` or ``MambaComponent``, with its
device and host LRU lists). ``sim/tree/core.py`` (``TreeCore``) holds the node ids
and their schemes, the clock, the key
compare, paths, ``Stats`` and the host-policy API through which the host policy's
duplicate reclaim runs; ``sim/tree/hnode.py`` the node. Citations name SGLang files
under ``sglang/srt/mem_cache/``: ``core`` is ``unified_cache/unified_tree_core.py``,
``full``/``swa``/``mamba``/``base`` are ``unified_cache/components/*.py``, and
``cache`` is ``unified_radix_cache.py``.

Keys are lists of units (one unit per page); token counts are ``units * page_size``.
Every node's slot counts stand in for SGLang's tensors:

* FULL: ``len(key) * page_size`` tokens on each tier it is on (``dev``, ``host``);
* SWA: the same count when ``aux`` (device) or ``aux_host`` is set, none for a
  tombstone;
* Mamba: one state slot when ``aux`` (device) or ``aux_host`` is set.

Public operations return one result object each (``Match``, ``Insert``,
``Eviction`` with per-component fields, ``HybridLoad``, ``LockReceipt``;
``sim/tree/results.py``), including what their backups and host evictions moved
(``backups`` / ``writes`` per component, ``host``). ``stats`` and ``hy`` count what
the tree did since it was built.
"""

from __future__ import annotations

import copy

from sim import constants as C
# The trees' shared refusals and invariant failures (sim/errors.py), by this package's names.
from sim.errors import InvariantError as HybridInvariantError  # noqa: F401
from sim.errors import TreeError as HybridTreeError  # noqa: F401
from sim.policies import resolve
from sim.policies.host import HOST_POLICIES
from sim.policies.write import WRITE_POLICIES
from sim.tree.components.base import LRUList, TreeComponent
from sim.tree.components.full import FullComponent
from sim.tree.core import ID_SCHEMES, RUST_ID_SCHEMES, Stats, TreeCore
from sim.tree.hnode import HNode, HostHNode
from sim.tree.results import (  # noqa: F401  (part of this module's API)
    NO_HOST_EVICTION,
    NO_ITEMS,
    HostEviction,
    HostInsert,
    HostLockReceipt,
    HybridCow,
    Eviction,
    Insert,
    HybridLoad,
    Match,
    LockReceipt,
)


_M64 = (1 << 64) - 1


def _content(node) -> int:
    """A node's term of ``content_hash`` (0 for a node holding no FULL KV)."""
    if node.dev or node.host:
        return hash((node.key[0], len(node.key), node.dev, node.host))
    return 0


def host_field(name: str, doc: str | None = None) -> property:
    """A tree attribute that is the host tier's field ``name`` (``_HostState``),
    read and written through it: the engine sets a rank's hooks and a skewed
    capacity on the tree (sim/tree/full.py)."""
    return property(lambda self: getattr(self.ht, name),
                    lambda self, v: setattr(self.ht, name, v), doc=doc)


class LoadBack:
    """An in-flight load-back: its id, anchor, device lock and host lock receipts,
    and the FULL tokens it moves H->D."""

    __slots__ = ("lid", "anchor", "lock", "host_lock", "tokens")

    def __init__(self, lid, anchor, lock, host_lock, tokens):
        self.lid = lid
        self.anchor = anchor
        self.lock = lock
        self.host_lock = host_lock
        self.tokens = tokens


class PendingWrite:
    """A D->H write in flight until its ack (``ongoing_write_through[ack_id]``):
    the device lock receipt it holds, the nodes its ack publishes (ancestors first;
    a split puts both fragments in), and the FULL tokens it copies."""

    __slots__ = ("ack_id", "lock", "nodes", "tokens", "aux")

    def __init__(self, ack_id, lock, nodes: list, tokens: int, aux: int = 0):
        self.ack_id = ack_id
        self.lock = lock
        self.nodes = nodes
        self.tokens = tokens
        self.aux = aux  # the component's host units it copies


class _HostState:
    """A hybrid tree's host tier: pool capacities and use, the host leaf set,
    ``full_host_duplicates`` (insertion-ordered), the reclaim digest and the
    in-flight load-backs (the component's host LRU is the component's own)."""

    __slots__ = ("host_capacity", "aux_host_capacity", "load_back_threshold", "host_used",
                 "aux_host_used", "h_leaves", "dups", "digest", "loads",
                 "policy", "wt", "threshold", "writes", "host_policy", "buffer_only",
                 "host_reserved", "on_host_backup", "host_alloc_fail", "dup_used")

    def __init__(self, host_capacity: int, aux_host_capacity: int, load_back_threshold: int,
                 write_policy: str = "write_back", host_policy: str = "duplicate_first"):
        self.host_capacity = host_capacity
        self.aux_host_capacity = aux_host_capacity
        self.load_back_threshold = load_back_threshold
        self.host_used = 0       # FULL host tokens
        self.dup_used = 0        # FULL tokens on both tiers (settled or not)
        self.aux_host_used = 0   # the component's host values
        self.h_leaves: set = set()
        self.dups: dict = {}
        self.digest = 0
        self.loads: dict = {}
        # The write policy (cache ``is_write_back`` / ``write_through_threshold``):
        # write_through and write_through_selective back nodes up at insert time and
        # ack them asynchronously; ``writes`` is ``ongoing_write_through``: ack id ->
        # [the backup's device lock receipt, the published nodes, ancestors first].
        w = WRITE_POLICIES[write_policy]
        self.policy = w.name
        self.wt = not w.write_back
        self.threshold = w.hit_threshold
        # The host-pressure policy (sim/policies/host.py): its duplicate reclaim opens
        # every FULL host eviction under write_back.
        self.host_policy = resolve(HOST_POLICIES, host_policy, "host policy")()
        self.writes: dict = {}
        # --hicache-host-memory-mode buffer_only (docs/STORAGE.md §9): no host values
        # in the tree (``UnifiedTreeCore.set_host_memory_buffer_only``); set by the
        # caller after construction.
        self.buffer_only = False
        # Storage (L3): host slots staged outside the tree for prefetches
        # (``allocate_storage_hit``), counted in every host room check; and the hook
        # called with each node a D->H ack publishes (``_finish_write_through_ack`` ->
        # ``write_backup_storage``), None without a storage tier.
        self.host_reserved = 0
        self.on_host_backup = None
        # A rank-local host allocation failure (cache_controller.write's allocator
        # returning None, sem §5.4.b): called once per backup whose room is made;
        # True fails it. None: allocations never fail.
        self.host_alloc_fail = None


class HybridStats:
    """Hybrid counters since the tree was built (summary.json ``hybrid``). The three
    the component's shared walks count (``aux_evicted``: device units tombstoned or
    deleted by eviction; ``aux_host_freed``: host units freed; ``aux_backups``: host
    units backups wrote) are reported under the component's names (Mamba's
    ``state_*``, SWA's ``swa_*``)."""

    MAMBA = ("state_backups", "state_loads", "host_hits_with_state", "host_hits_full_only",
             "host_hit_tokens", "state_host_frees", "cows", "state_evictions",
             "insert_state_evictions", "state_misses", "state_miss_tokens")
    SWA = ("swa_evicted_tokens", "swa_early_releases")
    # SWA with a host tier (reported only then)
    SWA_HOST = ("swa_backup_tokens", "swa_load_tokens", "swa_host_free_tokens",
                "host_hits_with_swa", "host_hits_full_only_swa", "swa_host_hit_tokens")
    # the component's names of the shared counters (properties below)
    _SHARED = ("state_evictions", "swa_evicted_tokens", "state_host_frees",
               "swa_host_free_tokens", "state_backups", "swa_backup_tokens")
    __slots__ = tuple(sorted(set(MAMBA + SWA + SWA_HOST) - set(_SHARED))) + (
        "aux_evicted", "aux_host_freed", "aux_backups")

    def __init__(self):
        for k in self.__slots__:
            setattr(self, k, 0)

    state_evictions = swa_evicted_tokens = property(lambda self: self.aux_evicted)
    state_host_frees = swa_host_free_tokens = property(lambda self: self.aux_host_freed)
    state_backups = swa_backup_tokens = property(lambda self: self.aux_backups)

    def as_dict(self, kind: str, host: bool = False) -> dict:
        keys = self.MAMBA if kind == "mamba" else self.SWA + (self.SWA_HOST if host else ())
        return {k: getattr(self, k) for k in keys}


class HybridTree(TreeCore):
    """The unified tree with components ``("full", aux.name)``; see the module
    docstring. ``aux``: the auxiliary component (``sim/tree/components/``: an
    ``SWAComponent`` or a ``MambaComponent``), whose hooks the core calls where
    SGLang's core loops over its components; ``full``: FULL's ``FullComponent``.
    ``SWATree`` and ``MambaTree`` build one with its component and add the
    component's own public ops. ``record=True`` keeps an event list (``rec``) per
    op, for op-trace replay."""

    # HiCache off unless the constructor is given a host pool (instance overrides).
    hicache = False
    # Device tokens running requests hold outside the tree (their fresh KV, allocated
    # at admission, adopted at insert): counted in every device room check. Written
    # by the replica's allocator only (sim.allocator.KVAllocator).
    reserved = 0
    # buffer_only's storage write intents (the engine's, sim/storage/engine.py): the
    # hook each write_through chain node is handed to, root first, and the ids the
    # current insert walk already presented (its ``begin_insert_walk`` set)
    on_backup_intent = None
    buffer_walk = None
    # A host-skewed rank (sim/ranks.py): its unskewed host capacity and the counter
    # to call where the skew changes what a backup's room check evicts.
    host_nominal = None
    host_skew_fired = None
    # An eviction's ``backups`` hold (FULL tokens, the component's host units) per
    # blocking backup; a FULL-only tree's hold FULL tokens (sim/tree/full.py).
    _full_backups = False
    # SGLANG_HICACHE_SKIP_HOST_DUPLICATE_RECLAIM (core ``drive_host_eviction``), read on
    # every FULL host eviction
    skip_reclaim = False
    # content_hash's running sum, kept once first asked for (instance overrides)
    _hashing = False
    _hash = 0
    _node_cls = HNode
    # The digest's event per released host copy: (id + 1) * stride + offset; a Rust
    # core's carries its component index (sem §4.6; instance overrides, ``ids``).
    _digest_stride = 1
    _digest_offset = 0

    # The host tier's state, read-only from outside (``_HostState``).
    host_capacity = property(lambda self: self.ht.host_capacity)
    aux_host_capacity = property(lambda self: self.ht.aux_host_capacity)
    load_back_threshold = property(lambda self: self.ht.load_back_threshold)
    host_used = property(lambda self: self.ht.host_used, doc="FULL host tokens")
    aux_host_used = property(lambda self: self.ht.aux_host_used,
                             doc="the component's host values (Mamba: states)")
    AUX = property(lambda self: self.aux.name, doc="the auxiliary component's name")
    lru = property(lambda self: self.aux.lru, doc="the component's device LRU")
    hlru = property(lambda self: self.aux.hlru, doc="the component's host LRU")
    h_leaves = property(lambda self: self.ht.h_leaves, doc="evictable host leaves")
    dups = property(lambda self: self.ht.dups, doc="full_host_duplicates, in order")
    digest = property(lambda self: self.ht.digest,
                      doc="write_back_duplicate_reclaim_digest")
    loads = property(lambda self: self.ht.loads, doc="in-flight load-backs by id")
    write_policy = property(lambda self: self.ht.policy)
    host_policy = property(lambda self: self.ht.host_policy,
                           doc="the host-pressure policy object (sim/policies/host.py)")
    writes = property(lambda self: self.ht.writes,
                      doc="write_through backups in flight: ack id -> [receipt, nodes]")

    def __init__(self, aux: TreeComponent, *, device_capacity: int, aux_capacity: int,
                 page_size: int = 1,
                 record: bool = False, host_capacity: int | None = None,
                 aux_host_capacity: int = 0, load_back_threshold: int = 1,
                 write_policy: str = "write_back", host_policy: str = "duplicate_first",
                 eviction_policy: str = "lru", ids: str = "optrace"):
        """``ids``: the node-id scheme (sim/tree/core.py ``ID_SCHEMES``, docs/OPTRACE.md
        §5): ``optrace`` (root 0, nodes from 1: the sentinels are clock draws only)
        unless told otherwise."""
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        if write_policy not in WRITE_POLICIES:
            raise ValueError(f"write_policy must be one of {', '.join(WRITE_POLICIES)}")
        # The eviction priority of FULL's device and host leaf heaps
        # (``tree_core.eviction_strategy.get_priority``, full.py
        # ``_evict_device_start`` / ``drive_host_eviction``).
        self.full = FullComponent(eviction_policy)
        # _cascade_evict from an internal auxiliary victim reaches only components of
        # lower or equal internal priority: none here, FULL's being higher. The walks
        # below rely on that (a three-component tree would need the cascade).
        assert C.EVICTION_PRIORITY_INTERNAL["full"] > aux.priority
        self.page_size = page_size
        self.device_capacity = device_capacity
        self.aux_capacity = aux_capacity
        self._clock = C.CLOCK_START
        self._next_id = 0
        if ids not in ID_SCHEMES:
            raise ValueError(f"unknown id scheme {ids!r}")
        if host_capacity is not None:
            self._node_cls = HostHNode
        # reset() builds a device and a host UnifiedLRUList per component type
        # (FULL's, and the auxiliary one's unless it is NoComponent's none), each
        # with a head and a tail sentinel node (an id and two clock draws).
        sentinels = C.SENTINEL_IDS_PER_COMPONENT * (1 + aux.lru_lists)
        if ids == "server":
            # a started server resets the core twice (UnifiedRadixCache.__init__):
            # the first reset's root and sentinels take ids before this root
            for _ in range(1 + sentinels):
                self._new_node([], None)
        elif ids == "rust_server":
            # the Rust core's constructor root, replaced by the server's reset
            for _ in range(C.RUST_SERVER_ROOTS_BEFORE):
                self._new_node([], None)
        if ids in RUST_ID_SCHEMES:
            self._digest_stride = C.RUST_COMPONENT_TYPES
            self._digest_offset = C.RUST_FULL_COMPONENT_INDEX
        self.root = self._new_node([], None)
        # reset(): root lock_ref 1 for every component; never a leaf, never evicted.
        self.root.lock = 1
        self.root.aux_lock = 1
        if ids in ("sglang", "server"):
            for _ in range(sentinels):
                self._new_node([], None)
        elif ids == "optrace":
            # the op-trace numbering moves sentinels out of the id space (oracle.py):
            # clock draws, no tree ids; the Rust core has none
            for _ in range(sentinels):
                self._tick()
                self._tick()
        self.d_leaves: set = set()
        self.dev_used = 0          # FULL device tokens (all tree-held)
        self.aux_used = 0          # SWA tokens / Mamba states held by the tree
        self.evictable = 0         # component_evictable_size_[FULL]
        self.protected = 0
        self.aux_evictable = 0     # component_evictable_size_[AUX]
        self.aux_protected = 0
        self.n_nodes = 0
        self.rec: list | None = [] if record else None
        self.stats = Stats()
        self.hy = HybridStats()
        # The host tier (HiCache on, under write_policy): host_capacity None keeps it off.
        # Its state lives in one object, so that a tree keeps few enough instance
        # attributes for CPython's fast attribute access (a dict past 30 shared keys
        # is slower on every access of the hot path).
        self.ht = _HostState(host_capacity or 0, aux_host_capacity, load_back_threshold,
                             write_policy, host_policy)
        if host_capacity is not None:
            self.hicache = True
            self._refresh = self._refresh_ht
            self._is_dleaf = self._is_dleaf_ht
        self.aux = aux
        aux.attach(self)
        self.full.attach(self)

    # ------------------------------------------------------------------ basics
    def aux_value_len(self, node: HNode) -> int:
        """``value_len`` of the auxiliary component (0 for a tombstone)."""
        return self.aux.value_len(node)

    def aux_value_len_of(self, node: HNode) -> int:
        """The size a device value on ``node`` would have (Mamba 1, SWA tokens)."""
        return self.aux.value_len_of(node)

    def _is_dleaf(self, node: HNode) -> bool:
        """core ``_is_device_leaf``: not root, FULL on device (always, with HiCache
        off), no lock on any component, no child with FULL on device (here: no
        child). ``_is_dleaf_ht`` replaces it with HiCache on."""
        return (node.lock == 0 and node.aux_lock == 0 and not node.children
                and node is not self.root)

    def _is_dleaf_ht(self, node: HNode) -> bool:
        """core ``_is_device_leaf`` with HiCache on: host-only children do not count."""
        if node.lock or node.aux_lock or node is self.root or not node.dev:
            return False
        for c in node.children.values():
            if c.dev:
                return False
        return True

    def _is_hleaf(self, node: HNode) -> bool:
        """core ``_is_host_leaf``: not root, FULL evicted and on host, no lock or host
        lock on any component, no child."""
        return (not node.dev and node.host and not node.children and node is not self.root
                and not (node.lock or node.aux_lock or node.host_lock or node.aux_host_lock))

    def _refresh_ht(self, node: HNode) -> None:
        """core ``_update_evictable_leaf_sets``, both tiers: ``_is_dleaf_ht`` and
        ``_is_hleaf`` folded into one pass over the node (the hottest call of the host
        tier; ``check`` holds both sets to those two predicates). A node with FULL
        on device is never a host leaf, one without it never a device leaf."""
        if node.lock or node.aux_lock or node is self.root:
            self.d_leaves.discard(node)
            self.ht.h_leaves.discard(node)
        elif node.dev:
            for c in node.children.values():
                if c.dev:
                    self.d_leaves.discard(node)
                    break
            else:
                self.d_leaves.add(node)
            self.ht.h_leaves.discard(node)
        else:
            self.d_leaves.discard(node)
            if node.host and not node.children and not (node.host_lock or node.aux_host_lock):
                self.ht.h_leaves.add(node)
            else:
                self.ht.h_leaves.discard(node)

    def _track(self, node: HNode) -> None:
        """core ``_update_duplicate_tracking``: a settled FULL duplicate (both tiers,
        no load-back pin, no write in flight: ``_is_settled_full_host_duplicate``)
        keeps or takes its place in the map; anything else leaves it."""
        if (node.dev and node.host and node.lb is None and node.wp is None
                and node is not self.root):
            if node.id not in self.ht.dups:
                self.ht.dups[node.id] = node
        else:
            self.ht.dups.pop(node.id, None)

    # ------------------------------------------------ FULL's residency, one place
    def _flip_dev(self, node: HNode, on: bool, t: int) -> None:
        """FULL's device value of ``node`` (``t`` tokens) set or freed: the device
        ledger, the tokens on both tiers and the content hash move with it (the
        lock-split ledgers are the caller's: they depend on why)."""
        if self._hashing:
            old = _content(node)
            node.dev = on
            self._hash = (self._hash - old + _content(node)) & _M64
        else:
            node.dev = on
        if not on:
            t = -t
        self.dev_used += t
        if node.host:
            self.ht.dup_used += t

    def _flip_host(self, node: HNode, on: bool, t: int) -> None:
        """FULL's host value of ``node`` set or freed: the host ledger, the tokens
        on both tiers and the content hash move with it."""
        if self._hashing:
            old = _content(node)
            node.host = on
            self._hash = (self._hash - old + _content(node)) & _M64
        else:
            node.host = on
        if not on:
            t = -t
        self.ht.host_used += t
        if node.dev:
            self.ht.dup_used += t

    @property
    def dup_tokens(self) -> int:
        """FULL tokens on both tiers."""
        return self.ht.dup_used

    @property
    def content_hash(self) -> int:
        """Every node's (first unit, length, FULL's tiers) hashed and summed (ids
        left out): equal contents give equal sums, so two replicas compare in O(1).
        Summed over the tree at the first ask (only replicas that are compared
        need it), then kept where a node's residency or extent changes."""
        if not self._hashing:
            self._hash = sum(_content(x) for x in self.iter_nodes()) & _M64
            self._hashing = True
        return self._hash

    def _refresh(self, node: HNode) -> None:
        """core ``_update_evictable_leaf_sets`` (the device half, HiCache off):
        ``_is_dleaf`` inline, this being the device tier's hottest call (``check``
        holds the set to the predicate)."""
        if (node.lock == 0 and node.aux_lock == 0 and not node.children
                and node is not self.root):
            self.d_leaves.add(node)
        else:
            self.d_leaves.discard(node)

    # ------------------------------------------------------------------ walks
    def _split(self, child: HNode, p: int) -> HNode:
        """core ``_split_node(child, p units)``: the new upper fragment takes a new id
        and becomes the parent; the original keeps its id and its lower key."""
        parent = child.parent
        old = _content(child) if self._hashing else 0
        up = self._new_node(child.key[:p], parent)
        up.creation = child.creation
        # full.py redistribute_on_node_split: the parent copies lock_ref (and, host
        # tier, the host value's slice, host_lock_ref and the host-lock boundary).
        up.lock = child.lock
        if self.hicache:
            up.dev = child.dev
            up.host = child.host
            up.host_lock = child.host_lock
            self._move_host_tops(child, up)
            up.lb = child.lb
            # _split_node: the hit count and a pending write_through ack carry over;
            # UpdatePendingBackupOnNodeSplit puts both fragments in the write's
            # publish list (cache ``_replace_pending_write_through_node``).
            up.hit_count = child.hit_count
            up.priority = child.priority
            ack = child.wp
            if ack is not None:
                up.wp = ack
                nodes = self.ht.writes[ack].nodes
                if child in nodes:
                    i = nodes.index(child)
                    nodes[i:i + 1] = [up, child]
        parent.children[child.key[0]] = up
        child.key = child.key[p:]
        child.parent = up
        up.children[child.key[0]] = child
        if self._hashing:
            self._hash = (self._hash - old + _content(up) + _content(child)) & _M64
        self.stats.splits += 1
        self.aux.split(up, child)
        # _for_each_component_lru(insert_after(child, new), skip_existing=True)
        if up.aux and up.lp is None:
            LRUList.add_after(child, up)
        child.last_access = self._tick()
        self.n_nodes += 1
        self._refresh(up)
        self._refresh(child)
        if self.hicache:
            self._track(up)
        if self.rec is not None:
            self._ev("split", up, child=child.id, n=len(up.key) * self.page_size)
        return up

    def _at_boundary(self, key: list, units: int) -> bool:
        """Whether the tree holds ``key[:units]`` as whole nodes on device (a reused
        prefix ends where its match ended, at a node boundary: docs/HYBRID.md §6)."""
        node, pos = self.root, 0
        while pos < units:
            child = node.children.get(key[pos])
            if child is None or not child.dev:
                return False
            k = len(child.key)
            if pos + k > units or key[pos:pos + k] != child.key:
                return False
            pos += k
            node = child
        return True

    # ------------------------------------------------------------------ match
    def match_prefix(self, key: list) -> Match:
        """core ``match_prefix`` / ``_match_prefix_helper`` (device only:
        ``match_device_only`` validators; both sets with HiCache on), then
        ``_match_post_processor``: the component's ``refresh_lru(MATCH_END)`` at
        ``best``, one clock draw stamped on ``best``, each ancestor
        ``MATCH_ANCESTOR_STEP`` earlier than its child, and each component's
        ``finalize_match_result_in_tree_core``."""
        if not key:
            return Match(0, 0, self.root, None)
        ps = self.page_size
        aux = self.aux
        hicache = self.hicache
        node, pos, n = self.root, 0, len(key)
        best, best_units = self.root, 0
        split = False
        hooks = aux.holds_values
        if hicache:
            # Two validator sets, one that also accepts host copies (best_match_node)
            # and the device-only one (last_device_node), every validator run at
            # every node; best_units are last_device_node's.
            dbest = self.root
            if hooks:
                valid = aux.match_validator(device_only=False)
                dvalid = aux.match_validator(device_only=True)
            else:
                valid = dvalid = None
            while pos < n:
                child = node.children.get(key[pos])
                if child is None or not (child.dev or child.host):
                    break
                ckey = child.key
                m = len(ckey)
                # most steps match the whole node: one slice compare, no call
                p = m if key[pos:pos + m] == ckey else self._common(key, pos, ckey)
                split = p < m
                node = self._split(child, p) if split else child
                pos += p
                # both validators run at every node, the host-accepting one first (None:
                # the component accepts every node, so there is nothing to call)
                if (valid is None or valid(node)) and (node.dev or node.host):
                    best = node
                if (dvalid is None or dvalid(node)) and node.dev:
                    dbest, best_units = node, pos
                if split:
                    break
        else:
            valid = aux.match_validator() if hooks else None
            while pos < n:
                child = node.children.get(key[pos])
                if child is None:
                    break
                ckey = child.key
                m = len(ckey)
                # most steps match the whole node: one slice compare, no call
                p = m if key[pos:pos + m] == ckey else self._common(key, pos, ckey)
                if p < m:
                    node = self._split(child, p)
                    split = True
                    pos += p
                    # FULL's validator holds (FULL on device); every validator runs.
                    if valid is None or valid(node):
                        best, best_units = node, pos
                    break
                pos += p
                node = child
                if valid is None or valid(node):
                    best, best_units = node, pos
        if hooks:
            aux.match_end(best)
        t = self._tick()
        x = best
        while x is not None:
            x.last_access = t
            t -= C.MATCH_ANCESTOR_STEP
            x = x.parent
        device_len = best_units * ps
        full_len = pos * ps
        if not hicache:
            return Match(device_len, full_len, best,
                         aux.branch(device_len, full_len) if hooks else None, split=split)
        # full finalize_match_result_in_tree_core: host_hit_length, the host tokens
        # from best_match_node up to last_device_node
        host = 0
        x, root = best, self.root
        while x is not dbest and x is not root:
            if x.host:
                host += len(x.key) * ps
            x = x.parent
        if not hooks:
            return Match(device_len, full_len, best, None, dbest, host, 0, split)
        return Match(device_len, full_len, best, aux.branch(device_len + host, full_len),
                     dbest, host, aux.host_hit(best), split)

    # ------------------------------------------------------------------ insert
    def insert(self, key: list, prev: int = 0, inserted: int = 0, *, priority: int = 0,
               **aux_args) -> Insert:
        """``checkpoint``'s insert: the request holds fresh KV past ``prev`` tokens
        (core ``begin_insert`` / ``_insert_walk_step`` / ``_insert_overlap_step`` /
        ``_insert_commit_step`` / ``_insert_tail_step``). ``inserted``: what the request
        inserted before (``InsertParams.inserted_len``, ``req.kv.cache_inserted_len``):
        write_through counts no hit on nodes ending at or below it. ``priority``:
        every node the walk enters or creates keeps the larger of its own and this
        (``_insert_helper``), which only the ``priority`` eviction policy reads; host
        tier only (its nodes hold the field)."""
        if priority and not self.hicache:
            raise ValueError("insert priority needs the host tier's nodes")
        ps = self.page_size
        n_tok = len(key) * ps
        # SWA and Mamba need the reused prefix to end on a node boundary; FULL alone
        # reads prev only to free the request's duplicate slots (components/none.py).
        if prev % ps or prev > n_tok or (self.aux.prev_at_boundary
                                         and not self._at_boundary(key, prev // ps)):
            raise HybridTreeError("bad_prev")
        res = Insert()
        res.new = n_tok - prev
        if res.new > self.device_capacity - self.dev_used - self.reserved:
            raise HybridTreeError("device_full")
        aux = self.aux
        hooks = aux.holds_values
        if hooks:
            aux.prepare_insert(key, prev, res, aux_args)
        self.root.last_access = self._tick()  # _touch_node(root)
        if not key:
            # begin_insert answers mamba_exist=True: the request's slot is freed
            res.node = self.root
            res.mamba_exist = True
            return res
        node, pos, n = self.root, 0, len(key)
        wt = self.hicache and self.ht.wt
        while pos < n:
            child = node.children.get(key[pos])
            if child is None:
                break
            child.last_access = self._clock  # _touch_node: one clock draw, inline
            self._clock += 1.0
            if priority > child.priority:
                child.priority = priority
            ckey = child.key
            m = len(ckey)
            p = m if key[pos:pos + m] == ckey else self._common(key, pos, ckey)
            if p < m:
                child = self._split(child, p)
                res.split = True
            if not child.dev:
                self._unevict(child)
                if hooks:
                    aux.recover_after_unevict(child, p * ps, pos * ps, aux_args)
            elif hooks:
                aux.insert_overlap(child, p * ps, pos * ps, prev, aux_args)
            # _finish_insert_walk_node: a walked node whose hit count reaches the
            # threshold is backed up at once (BackupKV is a barrier).
            if wt and (pos + p) * ps > inserted and self._inc_hit(child):
                self._write_chain(child, res)
            node = child
            pos += p
        res.prefix_len = pos * ps
        if pos < n:
            leaf = self._new_node(key[pos:], node)
            if priority:
                leaf.priority = priority
            node.children[key[pos]] = leaf
            t = (n - pos) * ps
            self.dev_used += t
            self.evictable += t
            self.n_nodes += 1
            if self._hashing:
                self._hash = (self._hash + _content(leaf)) & _M64
            self._refresh(leaf)
            self._refresh(node)
            if self.rec is not None:
                self._ev("new", leaf, n=t)
            res.node = leaf
            if hooks:
                aux.commit_insert(leaf, True, res, aux_args)
        else:
            res.node = node
            if hooks:
                aux.commit_insert(node, False, res, aux_args)
        if hooks and res.node is not self.root:
            aux.insert_end(res.node)
        if wt:
            self._backup_after_insert(res.node, (n_tok > inserted) if pos < n else None, res)
        return res

    # ------------------------------------------------- write_through (host tier)
    def _inc_hit(self, node: HNode) -> bool:
        """core ``_inc_hit_count_and_check`` (write_through policies): count the hit
        on a device node and say whether it needs a backup (no host copy yet and
        ``hit_count >= write_through_threshold``)."""
        if not node.dev:
            return False
        node.hit_count += 1
        return not node.host and node.hit_count >= self.ht.threshold

    def _backup_after_insert(self, target: HNode, new_leaf, res: Insert) -> None:
        """core ``_insert_tail_step`` / ``_should_backup_after_insert``: a new leaf
        (``new_leaf``: True to count it, False when it ends at or below the request's
        ``inserted_len``, None for an existing target) is counted and backed up with
        its unbacked ancestors at the threshold; an
        existing target already backed up, with no write in flight, backs up the
        component's value it lacks on host (``_needs_incremental_component_backup``:
        Mamba, a device state with no host copy)."""
        if new_leaf is not None:
            if new_leaf and self._inc_hit(target):
                self._write_chain(target, res)
        elif (target.host and target.wp is None and self.aux.holds_values
              and self.aux.needs_incremental_backup(target)):
            self._write_chain(target, res)

    def _write_chain(self, node: HNode, res: Insert) -> None:
        """core ``_build_backup_kv_action`` (write_through: the node and its unbacked
        ancestors, ancestors first) run by cache ``_execute_and_commit_kv_backup``:
        top-down, skipping a node with nothing to write, stopping at the first
        failed backup."""
        if self.ht.buffer_only:
            # _build_backup_kv_action: nothing is ever backed up, so the chain runs
            # to the root; each node, root first, becomes a storage write intent
            # (BufferModePipeline.enqueue_backup_intent), none of them tree state.
            intent = self.on_backup_intent
            if intent is not None:
                chain = []
                x, root, seen = node, self.root, self.buffer_walk
                while x is not root and not x.host:
                    if seen is not None and x.id in seen:
                        break  # presented earlier in this walk, and so were its ancestors
                    chain.append(x)
                    x = x.parent
                for x in reversed(chain):
                    intent(x)
            return
        chain = [node]
        a, root = node.parent, self.root
        while a is not None and a is not root and not a.host:
            chain.append(a)
            a = a.parent
        for y in reversed(chain):
            if self._try_backup(y, res) is None:
                return

    def stage_buffer_backup(self, x: HNode) -> None:
        """buffer_only's D2H launch of ``x`` into host staging
        (``BufferModePipeline._stage_backup_intent``): ``x`` holds a device lock until
        its ack (``finish_backup_ack`` -> ``dec_lock_ref``, ``write_ack`` here), under
        ack id ``x.id``; no host value is set. A split meanwhile publishes both pieces,
        as a write_through backup's does."""
        receipt = self.inc_lock(x)
        x.wp = x.id
        pw = self.ht.writes[x.id] = PendingWrite(x.id, receipt, [x], len(x.key) * self.page_size)
        return pw

    def write_ack(self, ack_id) -> None:
        """cache ``_finish_write_through_ack``: core ``finish_write_through`` (each
        published node still pending under this ack is cleared and tracked as a
        duplicate, in list order), then the backup's device lock is released."""
        pw = self.ht.writes.pop(ack_id)
        receipt, nodes = pw.lock, pw.nodes
        for y in nodes:
            if y.wp == ack_id:
                y.wp = None
                self._track(y)
        self.dec_lock(receipt)
        hook = self.ht.on_host_backup
        if hook is not None:  # write_backup_storage for every published node
            for y in nodes:
                hook(y)

    def _unevict(self, node: HNode) -> None:
        """core ``_unevict_node_on_insert``: an evicted node the insert walks over
        takes the request's fresh KV (a duplicate at once when it has a host copy);
        the auxiliary ``recover_after_unevict`` does nothing for Mamba."""
        t = len(node.key) * self.page_size
        self._flip_dev(node, True, t)
        if node.lock > 0:
            self.protected += t
        else:
            self.evictable += t
        self.stats.unevict_tokens += t
        self._refresh(node)
        self._track(node)
        self._refresh(node.parent)
        if self.rec is not None:
            self._ev("unevict", node, n=t)

    # ------------------------------------------------------------------ locks
    def inc_lock(self, node: HNode, skip_aux: bool = False) -> LockReceipt:
        """core ``inc_lock_ref``: FULL's path lock, then the auxiliary lock unless
        ``skip_aux`` (``skip_lock_components``: the Mamba-less decode hold)."""
        self.full.acquire_lock(node)
        receipt = LockReceipt(node, None if skip_aux else self.aux.acquire_lock(node), skip_aux)
        self._refresh(node)
        return receipt

    def dec_lock(self, receipt: LockReceipt) -> None:
        """core ``dec_lock_ref``: auxiliary release first (``_release_components``
        walks the components in reverse), then FULL's path unlock."""
        node = receipt.node
        if not (receipt.swa_released or receipt.skip_aux):
            self.aux.release_lock(node, receipt.uuid)
        self.full.release_lock(node)
        self._refresh(node)

    # ------------------------------------------------------------------ eviction
    def evict(self, full: int = 0, aux: int = 0) -> Eviction:
        """cache ``evict`` -> ``_evict_components`` (no availability targets): each
        component in tree order walks its own victims until its running total, which
        includes what earlier cascades freed, reaches its request."""
        res = Eviction()
        if res.freed < full:
            self.full.evict_device(full, res)
        if res.aux < aux:
            self.aux.evict_device(aux, res)
        return res

    def _delete_leaf(self, x: HNode, res: Eviction) -> None:
        """core ``_delete_unbacked_device_leaf``: ``_release_all_component_layers``
        (FULL's and the auxiliary value freed, each counted toward its own total),
        unlink, refresh the parent; ``_iteratively_delete_tombstone_ancestors`` stops
        at once since the parent's FULL is on device."""
        t = len(x.key) * self.page_size
        res.freed += t
        res.deleted += t
        self.stats.delete_tokens += t
        self.evictable -= t
        self.dev_used -= t
        if self._hashing:
            self._hash = (self._hash - _content(x)) & _M64
        if x.aux:
            res.aux += self.aux.evict_component(x, event=False)
        self.d_leaves.discard(x)
        parent = x.parent
        if self.rec is not None:
            self._ev("delete", x, n=t)
        del parent.children[x.key[0]]  # x.parent stays: the FULL walk reads it next
        self.n_nodes -= 1
        self._refresh(parent)

    # ------------------------------------------------------------- host tier
    # HiCache on: write_back (docs/HYBRID.md §5) and the write_through policies
    # (§5.9; the write_through section above the locks). Citations: core =
    # unified_tree_core.py, cache = unified_radix_cache.py.

    def _alive(self, x: HNode) -> bool:
        p = x.parent
        return p is not None and p.children.get(x.key[0]) is x

    def _evict_dleaf(self, x: HNode, res: Eviction) -> None:
        """core ``evict_device_leaf`` under write_back: a backed-up leaf is demoted; an
        unbacked one is backed up (FULL and the component's state, cache
        ``_execute_and_commit_kv_backup``) and demoted, or, when the host has no room,
        dropped with its host-only subtree (``drop_subtree_no_host``) unless
        something there is locked or pinned."""
        if x.host:
            self._demote(x, res)
        elif self.ht.wt:
            self._delete_unbacked(x, res)
        elif self._backup(x, res) > 0:
            self._demote(x, res)
        else:
            f0 = res.freed
            res.backups_failed += 1
            if self._drop(x, res):
                self.stats.drops += 1
                self.stats.drop_tokens += res.freed - f0
                res.dropped += res.freed - f0
            else:
                res.declined += 1
                self.stats.drop_declined += 1
                if self.rec is not None:
                    self._ev("drop_declined", x)

    def _delete_unbacked(self, x: HNode, res: Eviction) -> None:
        """core ``_delete_unbacked_device_leaf`` (write_through's unbacked D-leaf):
        every layer freed, the node unlinked, then
        ``_iteratively_delete_tombstone_leaf`` from its parent."""
        t = len(x.key) * self.page_size
        self.stats.delete_tokens += t
        res.deleted += t
        self._release_layers(x, res)
        parent = x.parent
        self._unlink(x, "delete")
        self._refresh(parent)
        self._sweep(parent, res)

    def _backup(self, x: HNode, res: Eviction) -> int:
        """write_back's blocking backup of ``x`` (``_write_backup``), counted and
        recorded in the eviction's ``backups``; one that wrote nothing counts as a
        failure. Returns the FULL tokens written (0: failed or nothing to write)."""
        w = self._write_backup(x, res)
        if w is None or not (w[0] or w[1]):
            self.stats.backup_failures += 1
            return 0
        item = w[0] if self._full_backups else w
        if res.backups is NO_ITEMS:
            res.backups = [item]
        else:
            res.backups.append(item)
        return w[0]

    def _try_backup(self, x: HNode, res: Insert):
        """write_through's insert-time backup of ``x`` (``_write_chain``), counted and
        recorded in the insert's ``writes`` (its ``PendingWrite``, under the node's
        id: ``mark_write_through_pending``). Returns ``_write_backup``'s result."""
        w = self._write_backup(x, res)
        if w is None:
            self.stats.backup_failures += 1
            res.backups_failed += 1
        elif w[0] or w[1]:
            pw = self.ht.writes[x.id]
            if res.writes is NO_ITEMS:
                res.writes = [pw]
            else:
                res.writes.append(pw)
        return w

    def _write_backup(self, x: HNode, res):
        """One node's D->H backup (cache ``_execute_and_commit_kv_backup``): FULL's
        tokens unless already on host, and the component's state. Host room: FULL's
        shortfall is evicted from the FULL host (giving up if that frees less), then
        the component's slot is allocated, evicting one from its host once
        (``resolve_host_transfers``); all or nothing. write_back acks it at once
        (``writing_check(write_back=True)``); write_through locks the node on device
        (``inc_lock_ref``) and marks it pending (``_track_write_through_node``) until
        its ``write_ack``. Returns (the FULL tokens written, the component's host
        units written), (0, 0) when there was nothing to write, None when the host
        had no room."""
        t = 0 if x.host else len(x.key) * self.page_size
        comp = self.aux
        aux = comp.backup_nodes(x) if comp.holds_values else NO_ITEMS
        if t == 0 and not aux:
            return 0, 0
        avail = self.ht.host_capacity - self.ht.host_used - self.ht.host_reserved
        if self.host_skew_fired is not None:
            # fired only where the skew changed this rank's action: it evicts on the
            # host where an unskewed pool would not, or a different amount
            nominal = avail + self.host_nominal - self.ht.host_capacity
            if max(0, t - avail) != max(0, t - nominal):
                self.host_skew_fired()
        if avail < t and self._evict_host(t - avail, res) < t - avail:
            return None
        if aux:
            k = 0
            for y in aux:
                k += comp.host_value_len(y)
            # HostPoolGroup.alloc(k, reclaim=host_evict_fn): reclaim k once, retry.
            if self.ht.aux_host_capacity - self.ht.aux_host_used < k:
                comp.drive_host_eviction(k)
                if self.ht.aux_host_capacity - self.ht.aux_host_used < k:
                    return None
        fail = self.ht.host_alloc_fail
        if fail is not None and fail():
            return None
        if t:
            self._flip_host(x, True, t)
        written = 0
        for y in aux:
            y.aux_host = True
            k = comp.host_value_len(y)
            self.ht.aux_host_used += k
            written += k
            if self.rec is not None:
                self._ev("host_set", y, c=comp.name, n=k)
        if self.rec is not None:
            self._ev("backup", x, n=t)
        if t or written:  # a backup that wrote something, counted once here
            st = self.stats
            st.backups += 1
            st.backup_tokens += t
            self.hy.aux_backups += written
        if self.ht.wt:
            receipt = self.inc_lock(x)
            # mark_write_through_pending: the component's nodes (SWA: the window's
            # slices) and ``x``, ancestors first, pending under ``x``'s ack
            published = [y for y in aux if y is not x]
            published.append(x)
            for y in published:
                y.wp = x.id
            self.ht.writes[x.id] = PendingWrite(x.id, receipt, published, t, written)
        else:
            # finish_write_through: every published node (the component's nodes and
            # ``x``, ancestors first: ``mark_write_through_pending``) is re-tracked at
            # the ack, a duplicate if settled.
            for y in aux:
                if y is not x:
                    self._track(y)
            self._track(x)
            hook = self.ht.on_host_backup
            if hook is not None:  # writing_check(write_back=True): acked before the demote
                for y in aux:
                    if y is not x:
                        hook(y)
                hook(x)
        return t, written

    def _demote(self, x: HNode, res: Eviction) -> None:
        """core ``_demote``: FULL's device value goes, the cascade takes the
        component's device value (a leaf: every priority is 0), a host copy joins
        the host LRU; the node stays, host-only."""
        t = len(x.key) * self.page_size
        if self.rec is not None:
            self._ev("demote", x, n=t)
        res.freed += t
        res.demoted += t
        self.stats.demote_tokens += t
        self.evictable -= t
        if x.aux:
            res.aux += self.aux.evict_component(x)
        self._flip_dev(x, False, t)
        self._refresh(x)
        if x.aux_host and x.hlp is None:
            self.aux.hlru.insert_mru(x)
        self._refresh(x.parent)

    def _locked_any(self, x: HNode) -> bool:
        return bool(x.lock or x.aux_lock or x.host_lock or x.aux_host_lock)

    def _drop(self, x: HNode, res: Eviction) -> bool:
        """core ``drop_subtree_no_host``: delete an unbackable D-leaf and its
        host-only subtree, unless anything there is locked or pinned."""
        if x.lb is not None or self._locked_any(x):
            return False
        below = []
        stack = list(x.children.values())
        while stack:
            y = stack.pop()
            if y.lb is not None or self._locked_any(y):
                return False
            below.append(y)
            stack.extend(y.children.values())
        for y in reversed(below):
            k = self._release_layers(y, res)
            self.stats.drop_host_tokens += k
            res.dropped_host += k
            self._unlink(y, "drop_host")
        self._release_layers(x, res)
        parent = x.parent
        self._unlink(x, "drop")
        self._refresh(parent)
        self._sweep(parent, res)
        return True

    def _release_layers(self, x: HNode, res: Eviction) -> int:
        """core ``_release_all_component_layers``: every value on both tiers is
        freed; device frees count toward the op's totals. Returns the FULL host
        tokens freed."""
        t = len(x.key) * self.page_size
        if x.dev:
            res.freed += t
            if x.lock:
                self.protected -= t
            else:
                self.evictable -= t
            self._flip_dev(x, False, t)
        host = 0
        if x.host:
            self._flip_host(x, False, t)
            host = t
        if x.aux:
            res.aux += self.aux.evict_component(x, event=False)
        if x.aux_host:
            self.aux.release_host_value(x)
        self.d_leaves.discard(x)
        self.ht.h_leaves.discard(x)
        return host

    def _unlink(self, x: HNode, why: str) -> None:
        """core ``_remove_leaf_from_parent``. ``why``: the core method whose removal
        this is, recorded as the event's kind (the FULL oracle names each:
        ``delete`` for ``_delete_unbacked_device_leaf``, ``drop`` / ``drop_host`` for
        ``drop_subtree_no_host``'s node / host-only subtree, ``host_evict`` for
        ``_evict_host_leaf``, ``tombstone`` for
        ``_iteratively_delete_tombstone_ancestors``; the hybrid oracle calls every
        one ``delete``: ``sim/hybrid/replay.py`` renders it so)."""
        if self.rec is not None:
            self._ev(why, x, n=len(x.key) * self.page_size)
        del x.parent.children[x.key[0]]
        self.ht.dups.pop(x.id, None)
        self.n_nodes -= 1

    def _sweep(self, cur: HNode, res: Eviction) -> None:
        """core ``_iteratively_delete_tombstone_ancestors``: childless ancestors with
        no FULL on either tier go, a FULL copy on either tier stops the walk."""
        root = self.root
        while cur is not root and not cur.children:
            if self._locked_any(cur):
                break
            if cur.dev:
                self._refresh(cur)
                break
            if cur.aux:
                res.aux += self.aux.evict_component(cur)
            if cur.host:
                self._refresh(cur)
                break
            if cur.aux_host:
                res.aux += self.aux.evict_host_component(cur)
            self.ht.h_leaves.discard(cur)
            parent = cur.parent
            self._unlink(cur, "tombstone")
            self._refresh(parent)
            cur = parent

    @staticmethod
    def _host_of(res) -> HostEviction:
        """``res.host`` (an op's result: the host evictions its backups ran), made
        a fresh ``HostEviction`` the first time the op evicts from host."""
        he = res.host
        if he is NO_HOST_EVICTION:
            he = res.host = HostEviction()
        return he

    @classmethod
    def _merge(cls, into: Eviction, ev: Eviction) -> None:
        """Add a nested eviction (one a load-back or a copy on write ran for room)
        to the op's summed ``Eviction``."""
        for name in ("freed", "aux", "demoted", "deleted", "dropped", "dropped_host",
                     "declined", "backups_failed"):
            setattr(into, name, getattr(into, name) + getattr(ev, name))
        if ev.backups:
            if into.backups is NO_ITEMS:
                into.backups = list(ev.backups)
            else:
                into.backups.extend(ev.backups)
        if ev.host is not NO_HOST_EVICTION:
            he = cls._host_of(into)
            for name in HostEviction.__slots__:
                setattr(he, name, getattr(he, name) + getattr(ev.host, name))

    def evict_host(self, n: int, component: str = "full", res: Eviction | None = None) -> int:
        """cache ``evict_host`` -> core ``drive_host_eviction``: FULL (duplicate
        reclaim first, then LRU host leaves) or the component (its host LRU).
        Returns what that component's tracker counted (buffer_only: 0, as
        ``UnifiedRadixCache.evict_host`` returns without evicting). ``res``: an
        ``Eviction`` whose ``host`` a FULL eviction's breakdown is added to (the
        ``HostEviction`` a FULL tree's ``evict_host`` returns)."""
        if self.ht.buffer_only:
            return 0
        if component == "full":
            return self._evict_host(n, Eviction() if res is None else res)
        return self.aux.drive_host_eviction(n)

    def _evict_host(self, n: int, op) -> int:
        """FULL's host eviction of ``n`` tokens for op result ``op`` (whose ``host``
        gets the breakdown); returns the tokens freed. The one entry every FULL host
        eviction goes through, so a scripted fault (sim/faults.py) wraps it once."""
        return self.full.drive_host_eviction(n, op)

    # The host-policy API (TreeCore's): the live re-check and one host copy's release.
    @staticmethod
    def reclaimable(node: HNode) -> bool:
        """The live re-check at release time: ``node`` is on both tiers and neither
        pinned by a load-back, awaiting a write_through ack nor host-locked."""
        return (node.dev and node.host and node.lb is None and node.wp is None
                and not node.host_lock)

    def _release_host_copy(self, node: HNode) -> int:
        """Free ``node``'s FULL host copy (the component's stays) and fold it into
        ``write_back_duplicate_reclaim_digest``; returns its tokens."""
        t = len(node.key) * self.page_size
        self._flip_host(node, False, t)
        event = (node.id + 1) * self._digest_stride + self._digest_offset
        self.ht.digest = (self.ht.digest * C.DIGEST_MULTIPLIER + event) & C.DIGEST_MASK
        return t

    def _evict_hleaf(self, x: HNode, res: Eviction) -> tuple[int, int]:
        """core ``_evict_host_leaf``: every component's values on the node go, and
        the node; returns (FULL host tokens, component host values) freed."""
        aux = self.aux.host_value_len(x) if x.aux_host else 0
        host = self._release_layers(x, res)
        self.stats.host_evict_tokens += host
        parent = x.parent
        self._unlink(x, "host_evict")
        self._sweep(parent, res)
        return host, aux

    # -- host locks and load-back
    def inc_host_lock(self, anchor: HNode) -> HostLockReceipt:
        """core ``inc_host_lock_ref``: FULL pins the anchor (write_back pins a
        device-only anchor too) with a boundary mark; the component locks the
        anchor's host value, which leaves the host LRU."""
        holder = self.full.acquire_host_lock(anchor)
        holder.aux_uuid = self.aux.acquire_host_lock(anchor)
        self._refresh(anchor)
        return holder

    def dec_host_lock(self, holder: HostLockReceipt) -> None:
        """core ``dec_host_lock_ref``: the component first (a host-only value
        rejoins the host LRU), then FULL up to the boundary mark."""
        anchor = holder.anchor
        self.aux.release_host_lock(anchor, holder.aux_uuid)
        if holder.full:
            self.full.release_host_lock(holder)
        self._refresh(anchor)

    # -- storage (L3) prefetch: what the tree sees (docs/STORAGE.md §1)
    def stage_host(self, n: int) -> None:
        """Hold ``n`` host slots outside the tree for a prefetch's pages
        (``allocate_storage_hit``); the caller has made room."""
        free = self.ht.host_capacity - self.ht.host_used - self.ht.host_reserved
        if n < 0 or n > free:
            raise HybridTreeError(f"stage_host({n}) with {free} host slots free")
        self.ht.host_reserved += n

    def unstage_host(self, n: int) -> None:
        """Give back ``n`` staged host slots (the prefetch landed or was dropped)."""
        if n < 0 or n > self.ht.host_reserved:
            raise HybridTreeError(f"unstage_host({n}) with {self.ht.host_reserved} staged")
        self.ht.host_reserved -= n

    # insert_host's hooks (TreeCore.insert_host; FULL's host values only: the
    # FULL-only core's)
    def _touch(self, node: HNode) -> None:
        node.last_access = self._tick()

    def _writes_through(self) -> bool:
        return self.ht.wt

    def _host_on(self, node: HNode) -> None:
        self._flip_host(node, True, len(node.key) * self.page_size)

    def load_back(self, match: Match, lid, holds: bool | None = None) -> HybridLoad:
        """cache ``init_load_back`` + ``load_back``: start the H->D load of the
        anchor's (``best_match_node``) FULL host tail and of the component's
        host-only state at the anchor. ``holds``: the loading request holds a state
        slot (Mamba's ``prepare_load_back``; None: no request). The result says what
        the load moved and whether the request was given a slot."""
        anchor = match.best
        if anchor.dev and match.host_len == 0 and match.aux_host_len == 0:
            return HybridLoad("no_host_tail")
        holder = self.inc_host_lock(anchor)
        lock = self.inc_lock(anchor)
        ev = Eviction()  # the evictions run for room, summed
        comp = self.aux
        slot = comp.prepare_load_back(anchor, holds, ev)
        reason, n, aux = self._load_transfers(anchor, lock, holder, ev)
        if not (ev.freed or ev.aux or ev.backups or ev.host is not NO_HOST_EVICTION):
            ev = None
        if reason is not None:
            comp.finalize_load_back(slot, False)
            return HybridLoad(reason, eviction=ev)
        self.ht.loads[lid] = LoadBack(lid, anchor, self.inc_lock(anchor), holder, n)
        self.stats.load_tokens += n
        comp.finalize_load_back(slot, True)
        return HybridLoad(None, n, aux, bool(slot), ev)

    def _load_transfers(self, anchor, lock, holder, ev: Eviction):
        """cache ``_load_back_transfers``: the spec (FULL's evicted nodes from the
        anchor up; the component's restore), the threshold, device room (FULL by
        ``evict_for_alloc``, the component's slot in the controller's load), then
        ``commit_load_back``. Returns (the refusal or None, FULL tokens loaded, the
        component's values restored)."""
        nodes = []
        x = anchor
        while not x.dev:
            nodes.append(x)
            x = x.parent
        nodes.reverse()
        comp = self.aux
        aux_nodes = comp.load_nodes(anchor)
        aux = bool(aux_nodes)
        pinned = any(y.lb is not None and y.lb is not anchor for y in nodes)
        if any(y.lb is not None and y.lb is not anchor for y in aux_nodes):
            pinned = True
        if pinned:
            nodes, aux, aux_nodes = [], False, []
        ps = self.page_size
        n = sum(len(y.key) for y in nodes) * ps
        if n < max(1, self.ht.load_back_threshold) and not aux:
            self.dec_lock(lock)
            self.dec_host_lock(holder)
            return "below_threshold", 0, 0
        avail = self.device_capacity - self.dev_used - self.reserved
        if avail < n:
            self._merge(ev, self.evict(n - avail, 0))
            if self.device_capacity - self.dev_used - self.reserved < n:
                self.dec_lock(lock)
                self.dec_host_lock(holder)
                return "no_device_space", 0, 0
        # HybridCacheController.load: FULL rows first (outside the tree until the
        # commit; nothing below reads FULL room), then the component's device slot.
        ok = comp.alloc_for_load(aux_nodes, ev) if aux else True
        self.dec_lock(lock)
        if not ok:
            self.dec_host_lock(holder)
            return f"no_{comp.name}_space", 0, 0
        for y in nodes:
            if self.rec is not None:
                self._ev("load", y, n=len(y.key) * ps)
        pin = not self.ht.wt  # commit_load_back pins under write_back only
        for y in nodes:
            if pin:
                y.lb = anchor
            t = len(y.key) * ps
            self._flip_dev(y, True, t)
            if y.lock > 0:
                self.protected += t
            else:
                self.evictable += t
            self._refresh(y)
        restored = 0
        for y in aux_nodes:  # commit_hicache_transfer(LOAD_BACK), oldest first
            k = comp.value_len_of(y)
            comp.set_value(y, k)
            restored += k
        self._refresh(anchor)
        return None, n, restored

    def finish_load_back(self, lid) -> None:
        """cache ``loading_check`` for one load: both anchor locks released, then
        core ``finish_load_back``: this load's pins cleared and the nodes tracked."""
        lb = self.ht.loads.pop(lid)
        self.dec_lock(lb.lock)
        self.dec_host_lock(lb.host_lock)
        x = lb.anchor
        wt = self.ht.wt
        while x is not None and x is not self.root:
            if wt:
                # write_through: no pins; every node on the path is re-tracked.
                self._track(x)
            elif x.lb is lb.anchor:
                x.lb = None
                self._track(x)
            x = x.parent

    # ------------------------------------------------------------------ replicas
    def clone(self, maps: dict | None = None) -> "HybridTree":
        """An independent copy (the engine forks a diverging rank off with this):
        nodes, LRU order, leaf set, counters and clock. Iterative, so deep chains do
        not hit the recursion limit. Receipts held outside move with ``receipt_in``.
        ``maps``: if given, filled with ``node(old) -> new`` and, with the host tier,
        ``holder(old) -> new`` (functions), so a caller's own references (a
        PrefetchBook's nodes and host locks) can follow."""
        new = copy.copy(self)
        nmap = {}
        stack = [self.root]
        while stack:
            x = stack.pop()
            y = copy.copy(x)
            y.lp = y.ln = None
            nmap[id(x)] = y
            stack.extend(x.children.values())
        for y in nmap.values():
            if y.parent is not None:
                y.parent = nmap[id(y.parent)]
            y.children = {k: nmap[id(c)] for k, c in y.children.items()}
        new.root = nmap[id(self.root)]
        new.d_leaves = {nmap[id(x)] for x in self.d_leaves}
        new.rec = None if self.rec is None else []
        new.stats = copy.copy(self.stats)
        new.hy = copy.copy(self.hy)
        if maps is not None:
            maps["node"] = lambda x: None if x is None else nmap.get(id(x))
        if self.hicache:
            holder = self._clone_host(new, nmap)
            if maps is not None:
                maps["holder"] = holder
        new.full = copy.copy(self.full)
        new.full.attach(new)
        new.aux = self.aux.clone_into(new, nmap)
        return new

    def _clone_host(self, new: "HybridTree", nmap: dict):
        """The host tier's part of ``clone``: the host leaf set, the duplicates map in
        order, in-flight writes and load-backs with their receipts and pins,
        host-lock boundaries. Returns the host-lock receipt map (old -> new, each
        receipt copied once, however many hold it)."""
        new._refresh = new._refresh_ht  # the instance's own bound methods, not ours
        new._is_dleaf = new._is_dleaf_ht
        new.ht = copy.copy(self.ht)
        new.ht.host_policy = type(self.ht.host_policy)()
        for y in nmap.values():
            y.hlp = y.hln = None
            if y.lb is not None:
                y.lb = nmap[id(y.lb)]
        new.ht.h_leaves = {nmap[id(x)] for x in self.ht.h_leaves}
        new.ht.dups = {nid: nmap[id(x)] for nid, x in self.ht.dups.items()}
        new.ht.writes = {}
        lock_in = self._receipt_copy
        for ack, pw in self.ht.writes.items():
            new.ht.writes[ack] = PendingWrite(ack, lock_in(pw.lock, nmap),
                                              [nmap[id(y)] for y in pw.nodes], pw.tokens, pw.aux)
        hmap = {}

        def holder_in(h):
            out = hmap.get(id(h))
            if out is None:
                out = hmap[id(h)] = HostLockReceipt(nmap[id(h.anchor)], h.full)
                out.top = nmap[id(h.top)]
                out.aux_uuid = h.aux_uuid
            return out

        new.ht.loads = {}
        for lid, lb in self.ht.loads.items():
            holder = holder_in(lb.host_lock)
            new.ht.loads[lid] = LoadBack(lid, holder.anchor, lock_in(lb.lock, nmap), holder,
                                         lb.tokens)
        for y in nmap.values():
            if y.host_tops:
                y.host_tops = [holder_in(h) for h in y.host_tops]
        return holder_in

    @staticmethod
    def _receipt_node(r: LockReceipt) -> HNode:
        """The node a device lock receipt the tree holds is anchored at."""
        return r.node

    @staticmethod
    def _receipt_copy(r: LockReceipt, nmap: dict) -> LockReceipt:
        """A device lock receipt the tree holds itself (a write's, a load-back's) on
        the clone whose nodes ``nmap`` maps."""
        out = LockReceipt(nmap[id(r.node)], r.uuid, r.skip_aux)
        out.swa_released = r.swa_released
        return out

    def receipt_in(self, receipt: LockReceipt) -> LockReceipt:
        """The same lock, anchored at this tree's node with the receipt's node id
        (a receipt taken on the tree this one was cloned from)."""
        node = self.node_by_id(receipt.node.id)
        if node is None:
            raise HybridTreeError("unknown_node")
        out = LockReceipt(node, receipt.uuid, receipt.skip_aux)
        out.swa_released = receipt.swa_released
        return out

    def node_by_id(self, nid: int):
        """The live node with id ``nid`` (the root included), or None. A walk: for
        forks, replay and tests, not for the engine's hot path."""
        if nid == self.root.id:
            return self.root
        for x in self.iter_nodes():
            if x.id == nid:
                return x
        return None

    def fingerprint(self) -> tuple:
        """A structural summary two replicas agree on iff their logical states match
        (ids excluded, as the FULL tree's ``fingerprint``)."""
        out = []
        stack = [self.root]
        while stack:
            x = stack.pop()
            if x is not self.root:
                row = (tuple(self.path_units(x)), x.aux, x.lock, x.aux_lock)
                if self.hicache:
                    row += (x.dev, x.host, x.host_lock, x.aux_host, x.aux_host_lock,
                            x.lb is not None)
                    if self.ht.wt:
                        row += (x.hit_count, x.wp is not None)
                out.append(row)
            stack.extend(sorted(x.children.values(), key=lambda c: c.key[0], reverse=True))
        return (self.dev_used, self.aux_used, tuple(out))

    # ------------------------------------------------------------------ views
    def iter_nodes(self):
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def check(self) -> None:
        """Every invariant SGLang's ``sanity_check`` and the pools would check here:
        ledgers against the nodes, the leaf set against its predicate, the LRU list
        against the nodes holding a value, and lock coverage."""
        ps = self.page_size
        dev = aux = ev = pr = aev = apr = cnt = 0
        in_tree = set()
        for n in self.iter_nodes():
            cnt += 1
            in_tree.add(n)
            t = len(n.key) * ps
            if not n.key:
                raise HybridInvariantError(f"node {n.id}: empty key")
            if n.parent.children.get(n.key[0]) is not n:
                raise HybridInvariantError(f"node {n.id}: not its parent's child")
            if n.dev:
                dev += t
                if n.lock > 0:
                    pr += t
                else:
                    ev += t
            if n.lock < 0 or n.aux_lock < 0:
                raise HybridInvariantError(f"node {n.id}: negative lock")
            if n.parent is not self.root and n.lock > n.parent.lock:
                raise HybridInvariantError(f"node {n.id}: FULL lock above its parent's")
            if n.aux:
                v = self.aux_value_len(n)
                aux += v
                if n.aux_lock > 0:
                    apr += v
                else:
                    aev += v
                if n.lp is None:
                    raise HybridInvariantError(f"node {n.id}: {self.AUX} value not in its LRU")
            elif n.lp is not None:
                raise HybridInvariantError(f"node {n.id}: {self.AUX} tombstone in its LRU")
            if (n in self.d_leaves) != self._is_dleaf(n):
                raise HybridInvariantError(f"node {n.id}: device leaf set disagrees")
        order = self.aux.lru.order()
        if len(order) != len(set(order)) or not set(order) <= in_tree:
            raise HybridInvariantError(f"{self.AUX} LRU holds a node twice or a dead node")
        if not self.d_leaves <= in_tree:
            raise HybridInvariantError("device leaf set holds a dead node")
        got = (dev, aux, ev, pr, aev, apr, cnt)
        want = (self.dev_used, self.aux_used, self.evictable, self.protected,
                self.aux_evictable, self.aux_protected, self.n_nodes)
        if got != want:
            raise HybridInvariantError(f"ledgers (dev, aux, evictable, protected, "
                                       f"aux_evictable, aux_protected, nodes): tree {got}, "
                                       f"counters {want}")
        if dev + self.reserved > self.device_capacity or aux > self.aux_capacity:
            raise HybridInvariantError("a pool is over capacity")
        if self.hicache:
            self._check_host(in_tree)
        self.aux.check()

    def _check_host(self, in_tree: set) -> None:
        """The host tier's invariants (sanity_check's leaf-set, LRU, host-size and
        structure parts): FULL on device is prefix-closed, every node holds FULL on
        some tier, host ledgers, the host leaf set, the component's host LRU (the
        host-only values that are not host-locked, and nothing else but host-only
        values), duplicates map entries, host-lock boundaries, load-back pins."""
        ps = self.page_size
        host = ahost = dup = 0
        for n in in_tree:
            t = len(n.key) * ps
            if n.dev and n.host:
                dup += t
            if not (n.dev or n.host):
                raise HybridInvariantError(f"node {n.id}: FULL on neither tier")
            if n.dev and n.parent is not self.root and not n.parent.dev:
                raise HybridInvariantError(f"node {n.id}: on device below an evicted parent")
            if n.host:
                host += t
            if n.aux_host:
                ahost += self.aux.host_value_len(n)
            if n.host_lock < 0 or n.aux_host_lock < 0:
                raise HybridInvariantError(f"node {n.id}: negative host lock")
            if n.hlp is not None and not (n.aux_host and not n.aux):
                raise HybridInvariantError(f"node {n.id}: in the host LRU without a "
                                           f"host-only {self.AUX} value")
            if n.aux_host and not n.aux and not n.aux_host_lock and n.hlp is None:
                raise HybridInvariantError(f"node {n.id}: host-only {self.AUX} value "
                                           f"missing from the host LRU")
            if (n in self.ht.h_leaves) != self._is_hleaf(n):
                raise HybridInvariantError(f"node {n.id}: host leaf set disagrees")
            if n.host_tops:
                for holder in n.host_tops:
                    if holder.top is not n:
                        raise HybridInvariantError(f"node {n.id}: host-lock boundary moved")
            if n.lb is not None and n.lb.id not in {lb.anchor.id for lb in self.ht.loads.values()}:
                raise HybridInvariantError(f"node {n.id}: pinned by a finished load-back")
            if (n.dev and n.host and n.lb is None and n.wp is None
                    and n.id not in self.ht.dups and not self._loading(n)):
                raise HybridInvariantError(f"node {n.id}: settled duplicate not tracked")
            if n.wp is not None and (n.wp not in self.ht.writes
                                     or n not in self.ht.writes[n.wp].nodes):
                raise HybridInvariantError(f"node {n.id}: pending under a write not in flight")
            if self.ht.wt:
                if n.host and n.parent is not self.root and not n.parent.host:
                    raise HybridInvariantError(f"node {n.id}: write_through host copy "
                                               f"under a parent without one")
                if n.aux_host and not n.host:
                    raise HybridInvariantError(f"node {n.id}: host {self.AUX} value "
                                               f"without FULL's host copy")
        order = self.aux.hlru.order()
        if len(order) != len(set(order)) or not set(order) <= in_tree:
            raise HybridInvariantError(f"{self.AUX} host LRU holds a node twice or a dead node")
        if not self.ht.h_leaves <= in_tree:
            raise HybridInvariantError("host leaf set holds a dead node")
        for nid, n in self.ht.dups.items():
            if n not in in_tree or n.id != nid:
                raise HybridInvariantError(f"duplicates map holds a dead node {nid}")
        for ack, pw in self.ht.writes.items():
            locked, nodes = self._receipt_node(pw.lock), pw.nodes
            if locked not in in_tree or locked.lock <= 0:
                raise HybridInvariantError(f"write {ack}: its node is gone or unlocked")
            for y in nodes:
                if y not in in_tree or not (y.host or self.ht.buffer_only):
                    raise HybridInvariantError(f"write {ack}: published node {y.id} gone "
                                               f"or without a host copy")
        if dup != self.ht.dup_used:
            raise HybridInvariantError(f"tokens on both tiers: tree {dup}, counter "
                                       f"{self.ht.dup_used}")
        if self._hashing and self._hash != sum(_content(x) for x in in_tree) & _M64:
            raise HybridInvariantError("content hash differs from the nodes' contents")
        if (host, ahost) != (self.ht.host_used, self.ht.aux_host_used):
            raise HybridInvariantError(f"host ledgers (FULL, {self.AUX}): tree {(host, ahost)}, "
                                       f"counters {(self.ht.host_used, self.ht.aux_host_used)}")
        if host > self.ht.host_capacity or ahost > self.ht.aux_host_capacity:
            raise HybridInvariantError("a host pool is over capacity")

    def _loading(self, n: HNode) -> bool:
        """write_through: whether ``n`` lies on an in-flight load-back's root path
        (loaded but re-tracked as a duplicate only at the ack, ``finish_load_back``)."""
        if not self.ht.wt:
            return False
        for lb in self.ht.loads.values():
            x = lb.anchor
            while x is not None and x is not self.root:
                if x is n:
                    return True
                x = x.parent
        return False
