"""One TP rank's replica of SGLang's unified radix tree under HiCache (FULL component).

The tree follows shared/reference/hicache-semantics.md ("sem §x") bit for bit: node
ids, the logical clock, splits, leaf sets, write_back backup/demote/drop, load-back
pins, the insertion-ordered duplicate map with lazy (stale) entries, the two-pass
reclaim and the digest. Slot counts stand in for device and host tensors.

Keys are lists of *units*; a unit is one page of ``page_size`` tokens (the token
itself at page size 1). Working in pages keeps every walk page-granular, as SGLang's
is, and costs one comparison per page instead of per token. Token counts are
``units * page_size``.

Every public operation returns one small result object (``Match``, ``Insert``,
``Eviction``, ``HostEviction``, ``LoadResult``, ``Backup``) saying exactly what it
did: the backups it issued, what it freed, how much of the duplicate map it scanned.
The engine charges time from these. The op's internal steps fill that one object in
place, so a public op allocates one result (two when it also evicts from host), never
one per step. ``stats`` keeps monotone counters for metrics only.

Host policies (``sim/policies/host.py``) see the tree through its public host-policy
API (``duplicates``, ``is_evictable_dleaf``, ``reclaimable``, ``release_duplicate``,
``forget_duplicate``, ``sweep_stale``) and return their own ``Reclaim`` result.

Eviction heaps are kept across calls ("lazy heaps") instead of being rebuilt from the
leaf sets on every call as SGLang does. Both give the same pops: between two pushes
of a node its priority cannot change, and an entry is only valid while it is the
node's newest one and the node is still a leaf (see ``_LeafHeap``).
"""

from __future__ import annotations

import copy
import heapq
from typing import Callable

from sim import constants as C
from sim.errors import InvariantError, TreeError  # noqa: F401  (part of this module's API)
from sim.policies import resolve
from sim.policies.eviction import EVICTION_POLICIES, READS_HIT_COUNT
from sim.policies.host import HOST_POLICIES
from sim.policies.write import WRITE_POLICIES
from sim.tree.core import Stats, TreeCore  # noqa: F401  (Stats: part of this module's API)
from sim.tree.results import (  # noqa: F401  (part of this module's API)
    _REJECTED,
    NO_HOST_EVICTION,
    NO_ITEMS,
    Backup,
    Eviction,
    HostEviction,
    HostInsert,
    Insert,
    LoadResult,
    Match,
)


_M64 = (1 << 64) - 1

# Node-id schemes: "optrace" (root 0, nodes 1, 2, ...: the op-trace contract),
# "sglang" (a bare Python core: sentinels 1-4, first node 5), "server" (a real 0.5.23
# server, whose core is reset twice: first node 10), "rust" (a bare Rust core's handles:
# root 0, first node 1), "rust_server" (the Rust core of a started server: root 1, first
# node 2). Both Rust schemes fold the Rust core's digest event (sem §4.6).
ID_SCHEMES = ("optrace", "sglang", "server", "rust", "rust_server")
RUST_ID_SCHEMES = ("rust", "rust_server")


def id_scheme(tree_core: str, ids: str) -> str:
    """The tree's id scheme for a scenario's ``cache.tree_core`` and ``cache.ids``: the
    Rust core has no sentinels, so a bare Rust core and op-trace numbering coincide."""
    if tree_core == "python":
        return ids
    return "rust_server" if ids == "server" else "rust"


def _content(node) -> int:
    """A node's term of ``Tree.content_hash`` (0 for a node holding no KV)."""
    if node.dev or node.host:
        return hash((node.key[0], len(node.key), node.dev, node.host))
    return 0


class Node:
    """A radix node: a span of pages with its device and host residency."""

    __slots__ = (
        "id", "parent", "children", "key",
        "dev", "host",              # FULL value / host value present
        "lock_ref", "host_lock_ref",
        "wt_pending", "lb_pending",  # write-through ack id / in-flight LoadBack (pins)
        "last_access", "creation", "hit_count", "priority",
        "n_dev_children",           # children with a device copy: D-leaf test in O(1)
        "host_tops",                # host-lock holders whose segment top is this node
        "dtok", "htok",             # token of the newest valid heap entry
    )

    def __init__(self, nid: int, key: list, parent: "Node | None", t_access: float, t_create: float):
        self.id = nid
        self.parent = parent
        self.children: dict = {}
        self.key = key
        self.dev = False
        self.host = False
        self.lock_ref = 0
        self.host_lock_ref = 0
        self.wt_pending = None
        self.lb_pending = None
        self.last_access = t_access
        self.creation = t_create
        self.hit_count = 0
        self.priority = 0
        self.n_dev_children = 0
        self.host_tops = None
        self.dtok = 0
        self.htok = 0

    def __repr__(self) -> str:
        tiers = ("D" if self.dev else "") + ("H" if self.host else "")
        return f"Node({self.id}, {len(self.key)}p, {tiers or '-'})"


class HostLock:
    """A host-lock holder: +1 ``host_lock_ref`` on a segment from ``anchor`` up to
    ``top``. The segment is one node until a split moves ``top`` to the new upper
    fragment (SGLang's boundary marker, sem §1.5)."""

    __slots__ = ("anchor", "top")

    def __init__(self, anchor: Node):
        self.anchor = anchor
        self.top = anchor


class LoadBack:
    """An in-flight H->D load: anchor locks, pinned nodes, and the tokens it moves."""

    __slots__ = ("lid", "anchor", "host_lock", "nodes", "tokens")

    def __init__(self, lid, anchor: Node, host_lock: HostLock, nodes: list, tokens: int):
        self.lid = lid
        self.anchor = anchor
        self.host_lock = host_lock
        self.nodes = nodes
        self.tokens = tokens


class PendingWrite:
    """An in-flight write-through D->H backup: the publish list and the locked node."""

    __slots__ = ("ack_id", "nodes", "locked", "tokens")

    def __init__(self, ack_id: int, node: Node, tokens: int):
        self.ack_id = ack_id
        self.nodes = [node]
        self.locked = node
        self.tokens = tokens


class _LeafHeap:
    """A min-heap of leaves that survives across eviction calls.

    ``push`` stamps the node with a fresh token; an entry is valid only while its
    token is the node's newest and the node is still in ``members``. So a node is
    popped at most once per push, with the priority it had when last pushed; the
    tree pushes again whenever a leaf's priority changes or a node becomes a leaf.
    """

    __slots__ = ("heap", "members", "prio", "attr", "seq")

    def __init__(self, prio, attr: str):
        self.heap: list = []
        self.members: set = set()
        self.prio = prio
        self.attr = attr  # "dtok" or "htok"
        self.seq = 0

    def push(self, node: Node) -> None:
        self.seq += 1
        setattr(node, self.attr, self.seq)
        heapq.heappush(self.heap, (self.prio(node), node.id, self.seq, node))
        if len(self.heap) > 4 * len(self.members) + 256:
            self._compact()

    def pop(self) -> Node | None:
        heap, attr, members = self.heap, self.attr, self.members
        while heap:
            _, _, tok, node = heapq.heappop(heap)
            if getattr(node, attr) == tok and node in members:
                setattr(node, attr, 0)  # consumed: not poppable again until re-pushed
                return node
        return None

    def _compact(self) -> None:
        attr = self.attr
        self.heap = [e for e in self.heap if getattr(e[3], attr) == e[2] and e[3] in self.members]
        heapq.heapify(self.heap)


class Tree(TreeCore):
    """A HiCache radix tree replica: device + host tiers of the FULL KV component.

    ``ids``: ``"optrace"`` numbers the root 0 and nodes 1, 2, ... (the op-trace
    contract); ``"server"`` a started 0.5.23 server (first node 10, ``ID_SCHEMES``);
    ``"sglang"`` reproduces a fresh SGLang process, where ``reset()``'s LRU
    sentinels take ids 1-4 (sem §1.3); ``"rust"`` numbers like optrace and folds the
    Rust core's digest event (sem §4.6); ``"rust_server"`` is the Rust core of a started
    server (root 1, first node 2, the Rust digest).
    """

    _node_cls = Node

    def __init__(
        self,
        *,
        device_capacity: int,
        host_capacity: int,
        page_size: int = 1,
        write_policy: str = "write_back",
        host_policy: str = "duplicate_first",
        eviction_policy: str = "lru",
        load_back_threshold: int = C.LOAD_BACK_THRESHOLD,
        ids: str = "optrace",
        record: bool = False,
    ):
        if page_size < 1:
            raise ValueError("page_size must be >= 1")
        self.page_size = page_size
        self.device_capacity = device_capacity
        self.host_capacity = host_capacity
        self.write = resolve(WRITE_POLICIES, write_policy, "write policy")
        # Read on every host eviction: a plain attribute, not the policy's property.
        self._reclaims_dups = self.write.reclaims_duplicates
        self.host_policy = resolve(HOST_POLICIES, host_policy, "host policy")()
        prio = resolve(EVICTION_POLICIES, eviction_policy, "eviction policy")
        # a hit count raised on a device leaf changes its priority: re-push it then
        self._hits_prio = eviction_policy in READS_HIT_COUNT
        if ids not in ID_SCHEMES:
            raise ValueError(f"unknown id scheme {ids!r}")
        self.ids = ids
        self.load_back_threshold = load_back_threshold
        # SGLANG_HICACHE_SKIP_HOST_DUPLICATE_RECLAIM, read on every host eviction (sem §3.4).
        self.skip_reclaim = False
        # Device tokens held outside the tree: running requests' fresh KV, allocated
        # at admission and adopted by the tree at insert. Counted in every free check.
        self.reserved = 0
        # Host slots held outside the tree: storage prefetches' staging, allocated at
        # the storage hit (`allocate_storage_hit`) and released or adopted when the
        # prefetch lands (`_handle_prefetch_result`). Counted in every host room check.
        self.host_reserved = 0
        # Storage (L3) write hook: called with each node whose D->H backup was just
        # acknowledged, in SGLang's order (`_finish_write_through_ack` then
        # `write_backup_storage(node_id)` for every published node). write_back's
        # eviction backups call it before the demote, as `writing_check(write_back=True)`
        # does. None: no storage tier (nothing else changes).
        self.on_host_backup: Callable[[Node], None] | None = None
        # --hicache-host-memory-mode buffer_only (docs/STORAGE.md §9): the tree never
        # holds host values (`UnifiedTreeCore.set_host_memory_buffer_only`). A
        # write_through trigger then hands each chain node, root-first, to
        # ``on_backup_intent`` (`_execute_and_commit_kv_backup` ->
        # `BufferModePipeline.enqueue_backup_intent`) instead of backing it up on host;
        # `evict_host` frees nothing (`UnifiedRadixCache.evict_host` returns 0).
        self.buffer_only = False
        self.on_backup_intent: Callable[[Node], None] | None = None
        # The node ids ``on_backup_intent`` admitted in the current insert walk (the
        # engine's `begin_insert_walk` set), so a chain stops where the walk already
        # presented it: the same intents, without a depth-squared walk per insert.
        self.buffer_walk: set | None = None
        # Sizes of the D->H backups issued since the engine last drained it (None: off).
        # Rank-local host allocation failure (a physical fault on one rank, sem §5.4.b).
        self.host_alloc_fail: Callable[[], bool] | None = None
        # A rank whose host pool is skewed: its unskewed capacity and the counter to
        # call when the skew changes what ``_host_room`` evicts (set by sim/ranks.py).
        self.host_nominal: int | None = None
        self.host_skew_fired: Callable[[], None] | None = None

        self._clock = C.CLOCK_START
        self._next_id = 0
        if ids == "server":
            # A real server resets the tree core twice (UnifiedRadixCache.__init__ calls
            # reset() after the core's constructor did, sem §1.3): the first reset's
            # root and sentinels consume ids and clock draws before this root.
            for _ in range(1 + C.SENTINEL_IDS_PER_COMPONENT):
                self._new_node([], None)
        elif ids == "rust_server":
            # the Rust core's constructor root, replaced by the server's second reset
            for _ in range(C.RUST_SERVER_ROOTS_BEFORE):
                self._new_node([], None)
        self.root = self._new_node([], None)
        self.root.lock_ref = 1  # never a leaf, never evicted
        if ids in ("sglang", "server"):
            # reset() builds a device and a host LRU list (head + tail sentinel) per
            # component after the root; each sentinel is a node: an id and two draws.
            for _ in range(C.SENTINEL_IDS_PER_COMPONENT):
                self._new_node([], None)
        self.digest = 0
        # XORed into the digest a rank reports (a scripted digest-only fault, sim.faults)
        self.digest_xor = 0
        rust = ids in RUST_ID_SCHEMES
        self.rust_core = rust
        self._digest_stride = C.RUST_COMPONENT_TYPES if rust else 1
        self._digest_offset = C.RUST_FULL_COMPONENT_INDEX if rust else 0

        self.dev_used = 0
        self.host_used = 0
        self.evictable = 0
        self.protected = 0
        self.dup_tokens = 0  # tokens on both tiers
        self.n_nodes = 0
        # A hash of every node's (first unit, length, tiers), summed: updated where a
        # node's residency or extent changes, so two replicas compare in O(1). With
        # the engine's prefix-unique page ids a node's first unit names its path.
        # Only replicas that are compared need it (a TP group whose ranks have
        # forked): it is summed once at the first ask, and kept from then on.
        self._hash = 0
        self._hashing = False
        self.dheap = _LeafHeap(prio, "dtok")
        self.hheap = _LeafHeap(prio, "htok")
        self.d_leaves = self.dheap.members
        self.h_leaves = self.hheap.members
        # full_host_duplicates: insertion-ordered, "insert if absent" (sem §2.4).
        self.dups: dict[int, Node] = {}
        self.pending_writes: dict[int, PendingWrite] = {}  # write-through acks, issue order
        self.loads: dict = {}  # in-flight load-backs by id
        self.stats = Stats()
        self.rec: list | None = [] if record else None

    # ---------------------------------------------- the one place for each count
    def _set_dev(self, node: Node, on: bool) -> None:
        t = len(node.key) * self.page_size
        if self._hashing:
            old = _content(node)
            node.dev = on
            self._hash = (self._hash - old + _content(node)) & _M64
        else:
            node.dev = on
        sign = 1 if on else -1
        self.dev_used += sign * t
        if node.host:
            self.dup_tokens += sign * t
        if node.lock_ref:
            self.protected += sign * t
        else:
            self.evictable += sign * t
        node.parent.n_dev_children += sign

    def _set_host(self, node: Node, on: bool) -> None:
        if self._hashing:
            old = _content(node)
            node.host = on
            self._hash = (self._hash - old + _content(node)) & _M64
        else:
            node.host = on
        t = (1 if on else -1) * len(node.key) * self.page_size
        self.host_used += t
        if node.dev:
            self.dup_tokens += t

    def _refresh(self, node: Node) -> None:
        """Re-derive ``node``'s D-leaf / H-leaf membership (sem §2.2)."""
        if node.parent is None:
            return
        if node.dev:
            if node.lock_ref == 0 and node.n_dev_children == 0:
                if node not in self.d_leaves:
                    self.d_leaves.add(node)
                    self.dheap.push(node)
            else:
                self.d_leaves.discard(node)
            self.h_leaves.discard(node)
            return
        self.d_leaves.discard(node)
        if node.host and not node.lock_ref and not node.host_lock_ref and not node.children:
            if node not in self.h_leaves:
                self.h_leaves.add(node)
                self.hheap.push(node)
        else:
            self.h_leaves.discard(node)

    def _set_time(self, node: Node, t: float) -> None:
        node.last_access = t
        if node in self.d_leaves:
            self.dheap.push(node)
        elif node in self.h_leaves:
            self.hheap.push(node)

    def _track(self, node: Node) -> None:
        """`_update_duplicate_tracking`: register a settled duplicate, keeping an
        existing entry's position; drop the entry of anything else (sem §3.7)."""
        if node.dev and node.host and node.wt_pending is None and node.lb_pending is None:
            if node.id not in self.dups:
                self.dups[node.id] = node
        else:
            self.dups.pop(node.id, None)

    # ------------------------------------------------------------------ locks
    def inc_lock(self, node: Node) -> None:
        """Device path lock from ``node`` up to the root (sem §1.5)."""
        root = self.root
        while node is not root:
            if node.lock_ref == 0:
                if node.dev:
                    t = len(node.key) * self.page_size
                    self.evictable -= t
                    self.protected += t
                node.lock_ref = 1
                self._refresh(node)
            else:
                node.lock_ref += 1
            node = node.parent

    def dec_lock(self, node: Node) -> None:
        root = self.root
        while node is not root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                if node.dev:
                    t = len(node.key) * self.page_size
                    self.evictable += t
                    self.protected -= t
                self._refresh(node)
            elif node.lock_ref < 0:
                raise InvariantError(f"node {node.id}: lock_ref below 0")
            node = node.parent

    def host_lock(self, anchor: Node) -> HostLock:
        holder = HostLock(anchor)
        anchor.host_lock_ref += 1
        self._mark_host_top(anchor, holder)
        self._refresh(anchor)
        return holder

    def host_unlock(self, holder: HostLock) -> None:
        node = holder.anchor
        while True:
            node.host_lock_ref -= 1
            if node.host_lock_ref == 0:
                self._refresh(node)
            if node is holder.top:
                break
            node = node.parent
        self._unmark_host_top(holder)

    # ------------------------------------------------------------------ walks
    def _split(self, child: Node, p: int) -> Node:
        """`_split_node(child, p)`: a new upper fragment takes the new id and becomes
        the parent; the original keeps its id, its lower key and its map position."""
        parent = child.parent
        old = _content(child) if self._hashing else 0
        up = self._new_node(child.key[:p], parent)
        up.creation = child.creation
        up.hit_count = child.hit_count
        up.priority = child.priority
        up.wt_pending = child.wt_pending
        up.lb_pending = child.lb_pending
        up.dev = child.dev
        up.host = child.host
        up.lock_ref = child.lock_ref
        up.host_lock_ref = child.host_lock_ref
        self._move_host_tops(child, up)
        parent.children[child.key[0]] = up
        child.key = child.key[p:]
        child.parent = up
        up.children[child.key[0]] = child
        up.n_dev_children = 1 if child.dev else 0
        if self._hashing:
            self._hash = (self._hash - old + _content(up) + _content(child)) & _M64
        self.n_nodes += 1
        self.stats.splits += 1
        self._set_time(child, self._tick())
        self._refresh(up)
        self._refresh(child)
        self._track(up)
        if child.wt_pending is not None:
            # UpdatePendingBackupOnNodeSplit: the ack publishes [up, child].
            nodes = self.pending_writes[child.wt_pending].nodes
            i = nodes.index(child)
            nodes[i:i + 1] = [up, child]
        if self.rec is not None:
            self._ev("split", up, child=child.id)
        return up

    def match_prefix(self, key: list) -> Match:
        """`match_prefix` (sem §3.2): may split the last node; stamps recency."""
        if not key:
            return Match(0, 0, self.root, self.root)
        node, pos, n = self.root, 0, len(key)
        last_dev, dev_pos = self.root, 0
        split = False
        while pos < n:
            child = node.children.get(key[pos])
            if child is None or not (child.dev or child.host):
                break
            p = self._common(key, pos, child.key)
            split = p < len(child.key)
            if split:
                child = self._split(child, p)
            pos += p
            node = child
            if child.dev:
                last_dev, dev_pos = child, pos
            if split:
                break
        t = self._tick()
        stamp = node
        # `_set_time` for the path, inlined: this loop runs on every match
        d_leaves, h_leaves, step = self.d_leaves, self.h_leaves, C.MATCH_ANCESTOR_STEP
        while stamp is not None:
            stamp.last_access = t
            if stamp in d_leaves:
                self.dheap.push(stamp)
            elif stamp in h_leaves:
                self.hheap.push(stamp)
            t -= step
            stamp = stamp.parent
        ps = self.page_size
        return Match(dev_pos * ps, (pos - dev_pos) * ps, last_dev, node, split)

    def insert(self, key: list, priority: int = 0, resident: bool = False,
               inserted: int = 0) -> Insert:
        """`insert` (sem §3.1). Raises TreeError("device_full") without changing
        anything when the new device tokens do not fit: inserts never evict.
        ``priority``: every node the walk enters or creates keeps the larger of its own
        and this (`_insert_helper`: ``node.priority = max(node.priority, priority)``),
        which only the ``priority`` eviction policy reads. ``resident``: the caller
        knows the whole key is on device (a prefix of what it just inserted), so the
        room check's walk is skipped: nothing new is needed. ``inserted``: the tokens
        the inserting request already inserted (`InsertParams.inserted_len`, its
        `req.kv.cache_inserted_len`): a node ending at or below it was counted when the
        request inserted it, so it counts no write_through hit now
        (unified_tree_core.py `_finish_insert_walk_node`, `_should_backup_after_insert`)."""
        ps = self.page_size
        new = 0 if resident else (len(key) - self.device_prefix_len(key)) * ps
        if new > self.device_capacity - self.dev_used - self.reserved:
            raise TreeError("device_full")
        root = self.root
        self._set_time(root, self._tick())
        res = Insert(root)
        if not key:
            return res
        wt = self.write.hit_threshold
        d_leaves, h_leaves = self.d_leaves, self.h_leaves
        node, pos, n = root, 0, len(key)
        while pos < n:
            child = node.children.get(key[pos])
            if child is None:
                break
            if priority > child.priority:
                child.priority = priority
            # `_set_time(child, self._tick())`, inlined (once per walked node)
            child.last_access = self._clock
            self._clock += 1.0
            if child in d_leaves:
                self.dheap.push(child)
            elif child in h_leaves:
                self.hheap.push(child)
            p = self._common(key, pos, child.key)
            if p < len(child.key):
                child = self._split(child, p)
                res.split = True
            if not child.dev:
                self._set_dev(child, True)
                self._refresh(child)
                self._refresh(node)
                self._track(child)
                self.stats.unevict_tokens += len(child.key) * ps
                if self.rec is not None:
                    self._ev("unevict", child, n=len(child.key) * ps)
            node = child
            pos += p
            if wt is not None and pos * ps > inserted:
                child.hit_count += 1
                if self._hits_prio and child in d_leaves:
                    self.dheap.push(child)
                if not child.host and child.hit_count >= wt:
                    self._write_through_chain(child, res)
        res.prefix_tokens = pos * ps
        res.new_device_tokens = new
        if pos < n:
            leaf = self._new_node(key[pos:], node)
            leaf.priority = priority
            node.children[key[pos]] = leaf
            self.n_nodes += 1
            self._set_dev(leaf, True)
            self._refresh(leaf)
            self._refresh(node)
            node = leaf
            if self.rec is not None:
                self._ev("new", leaf, n=len(leaf.key) * ps)
            if wt is not None and n * ps > inserted:
                leaf.hit_count = 1
                if self._hits_prio and leaf in d_leaves:
                    self.dheap.push(leaf)
                if leaf.hit_count >= wt:
                    self._write_through_chain(leaf, res)
        res.node = node
        return res

    # --------------------------------------------------------- write-through
    def _write_through_chain(self, node: Node, res: Insert) -> None:
        """Back up ``node`` and its ancestors lacking a host copy, root-first; each
        holds a device path lock until its ack. A failed host allocation abandons the
        rest of the chain (sem §3.5). Reports into the insert's result."""
        chain = []
        x = node
        seen = self.buffer_walk
        while x is not self.root and not x.host:
            if seen is not None and x.id in seen:
                break  # presented earlier in this walk, and so were its ancestors
            chain.append(x)
            x = x.parent
        if self.buffer_only:
            # `_build_backup_kv_action`: nothing is ever backed up, so the chain runs
            # to the root; each node becomes a storage write intent (no host copy)
            if self.on_backup_intent is not None:
                for x in reversed(chain):
                    self.on_backup_intent(x)
            return
        for x in reversed(chain):
            k = len(x.key) * self.page_size
            if not self._host_room(k, res):
                self.stats.backup_failures += 1
                res.backups_failed += 1
                return
            self._set_host(x, True)
            self.inc_lock(x)
            x.wt_pending = x.id
            pw = PendingWrite(x.id, x, k)
            self.pending_writes[x.id] = pw
            if res.writes is NO_ITEMS:
                res.writes = [pw]
            else:
                res.writes.append(pw)
            self.stats.backups += 1
            self.stats.backup_tokens += k
            if self.rec is not None:
                self._ev("backup", x, n=k)


    def stage_buffer_backup(self, x: Node) -> PendingWrite:
        """buffer_only's D2H launch of ``x`` into host staging
        (`BufferModePipeline._stage_backup_intent`): ``x`` holds a device path lock
        until its D2H ack (`finish_backup_ack` -> `dec_lock_ref`), which
        `finish_write_through` releases as for any backup; no host value is set. A
        split meanwhile patches the ack's node list as for a write_through publish."""
        k = len(x.key) * self.page_size
        self.inc_lock(x)
        x.wt_pending = x.id
        pw = PendingWrite(x.id, x, k)
        self.pending_writes[x.id] = pw
        return pw

    def finish_write_through(self, ack_id: int) -> None:
        """`finish_write_through`: unpin and register the published nodes, then
        release the backup's device lock."""
        pw = self.pending_writes.pop(ack_id)
        for x in pw.nodes:
            if x.wt_pending == ack_id:
                x.wt_pending = None
                self._track(x)
        self.dec_lock(pw.locked)
        if self.on_host_backup is not None:
            for x in pw.nodes:  # each fragment is written to storage
                self.on_host_backup(x)

    @property
    def host_free(self) -> int:
        """Host slots neither in the tree nor staged for a prefetch."""
        return self.host_capacity - self.host_used - self.host_reserved

    def stage_host(self, n: int) -> None:
        """Hold ``n`` host slots outside the tree for a storage prefetch's pages
        (`allocate_storage_hit`'s `mem_pool_host.alloc`); the caller has made room."""
        if n < 0 or n > self.host_free:
            raise TreeError(f"stage_host({n}) with {self.host_free} host slots free")
        self.host_reserved += n

    def unstage_host(self, n: int) -> None:
        """Give back ``n`` staged host slots: the prefetch landed (its pages are
        inserted through ``insert_host``, which allocates them again) or was dropped."""
        if n < 0 or n > self.host_reserved:
            raise TreeError(f"unstage_host({n}) with {self.host_reserved} staged")
        self.host_reserved -= n

    @property
    def content_hash(self) -> int:
        """Every node's (first unit, length, tiers) hashed and summed (ids left out):
        equal contents give equal sums. Summed over the tree at the first ask, then
        kept up to date where a node's residency or extent changes."""
        if not self._hashing:
            self._hash = sum(_content(node) for node in self.iter_nodes()) & _M64
            self._hashing = True
        return self._hash

    def _host_room(self, k: int, res) -> bool:
        """Make room for ``k`` host tokens: evict exactly the shortfall, and fail if
        that frees less than asked (sem §3.3 step 1.2). The host eviction is added to
        ``res.host`` (``res``: the public op's result, an Insert, Eviction or Backup)."""
        avail = self.host_free
        if self.host_skew_fired is not None:
            # Fired only where the skew changed this rank's action: it evicts on the
            # host where an unskewed pool would not, or a different amount.
            nominal = avail + self.host_nominal - self.host_capacity
            if max(0, k - avail) != max(0, k - nominal):
                self.host_skew_fired()
        if avail < k:
            need = k - avail
            he = res.host
            if he is NO_HOST_EVICTION:
                he = res.host = HostEviction()
            if self._evict_host(need, he) < need:
                return False
        # The all-or-nothing host allocation itself can fail on one rank only.
        return self.host_alloc_fail is None or not self.host_alloc_fail()

    # ------------------------------------------------------- device eviction
    def evict_device(self, n: int) -> Eviction:
        """Free at least ``n`` device tokens from LRU D-leaves (sem §3.3)."""
        res = Eviction()
        if n <= 0:
            return res
        freed = demoted = 0
        declined = None  # built on first use: declines are rare
        ps = self.page_size
        write_back = self.write.write_back
        while freed < n:
            x = self.dheap.pop()
            if x is None:
                break
            k = len(x.key) * ps
            if x.host:
                self._demote(x)
                demoted += k
            elif not write_back:
                self.stats.delete_tokens += k
                if self.rec is not None:
                    self._ev("delete", x, n=k)
                self._delete(x)
                res.deleted += k
            elif self._backup_write_back(x, res):
                if res.backups is NO_ITEMS:
                    res.backups = [k]
                else:
                    res.backups.append(k)
                self._demote(x)
                demoted += k
            else:
                res.backups_failed += 1
                if self._drop(x, res):
                    res.dropped += k
                else:
                    if declined is None:
                        declined = [x]
                    else:
                        declined.append(x)
                    self.stats.drop_declined += 1
                    if self.rec is not None:
                        self._ev("drop_declined", x)
                    continue
            freed += k
        if declined is not None:
            res.declined = len(declined)
            for x in declined:  # popped, so not retried in this walk; still D-leaves
                self.dheap.push(x)
        res.freed = freed
        res.demoted = demoted
        return res

    def _demote(self, x: Node) -> None:
        """Free the device copy; the node stays host-only and its map entry, if any,
        goes stale in place."""
        k = len(x.key) * self.page_size
        if self.rec is not None:
            self._ev("demote", x, n=k)
        self._set_dev(x, False)
        self.stats.demote_tokens += k
        self._refresh(x)
        self._refresh(x.parent)

    def _backup_write_back(self, x: Node, res) -> bool:
        """The blocking single-node D->H backup of a write_back victim; registered as
        a duplicate at its (synchronous) ack, right before the demote. Host room is
        made into ``res.host``; the caller records the backup in ``res``."""
        k = len(x.key) * self.page_size
        if not self._host_room(k, res):
            self.stats.backup_failures += 1
            return False
        self._set_host(x, True)
        self.stats.backups += 1
        self.stats.backup_tokens += k
        if self.rec is not None:
            self._ev("backup", x, n=k)
        self._track(x)
        if self.on_host_backup is not None:
            self.on_host_backup(x)
        return True

    def backup_node(self, x: Node) -> Backup:
        """`backup_node_for_write_back`: the same blocking single-node backup without
        the demote, leaving ``x`` a registered duplicate (sem §3.3, aux tombstoning)."""
        res = Backup()
        if x.host or not x.dev:
            res.ok = x.host
        elif self._backup_write_back(x, res):
            res.ok = True
            res.tokens = len(x.key) * self.page_size
        return res

    def _drop(self, x: Node, res: Eviction) -> bool:
        """`drop_subtree_no_host`: delete an unbackable victim and its host-only
        subtree, unless anything in it is locked or pinned (sem §3.3)."""
        if x.lb_pending is not None or x.lock_ref or x.host_lock_ref:
            return False
        below = []
        stack = list(x.children.values())
        while stack:
            y = stack.pop()
            if y.wt_pending is not None or y.lb_pending is not None or y.lock_ref or y.host_lock_ref:
                return False
            below.append(y)
            stack.extend(y.children.values())
        ps = self.page_size
        if below:
            if self.rec is not None:
                for y in sorted(below, key=self.path_units):
                    self._ev("drop_host", y, n=len(y.key) * ps)
            for y in reversed(below):  # reversed DFS pre-order: children before parents
                k = len(y.key) * ps
                self.stats.drop_host_tokens += k
                res.dropped_host += k
                self._delete(y, cascade=False)
        k = len(x.key) * ps
        if self.rec is not None:
            self._ev("drop", x, n=k)
        self.stats.drops += 1
        self.stats.drop_tokens += k
        self._delete(x)
        return True

    def _delete(self, x: Node, cascade: bool = True) -> None:
        """`_remove_leaf_from_parent`, then delete childless ancestors left with no
        copy at all (tombstones; never expected in the FULL-only path)."""
        parent = x.parent
        del parent.children[x.key[0]]
        if x.dev:
            self._set_dev(x, False)
        if x.host:
            self._set_host(x, False)
        self.d_leaves.discard(x)
        self.h_leaves.discard(x)
        self.dups.pop(x.id, None)
        self.n_nodes -= 1
        if cascade:
            while (parent is not self.root and not parent.children and not parent.dev
                   and not parent.host and not parent.lock_ref):
                if self.rec is not None:
                    self._ev("tombstone", parent)
                grand = parent.parent
                del grand.children[parent.key[0]]
                self.d_leaves.discard(parent)
                self.h_leaves.discard(parent)
                self.dups.pop(parent.id, None)
                self.n_nodes -= 1
                parent = grand
        self._refresh(parent)

    # --------------------------------------------------------- host eviction
    def evict_host(self, n: int) -> HostEviction:
        """`drive_host_eviction(FULL, n)`: duplicate reclaim first (write_back, the
        configured policy), then LRU H-leaves, sharing one counter (sem §3.4)."""
        res = HostEviction()
        if n > 0 and not self.buffer_only:
            self._evict_host(n, res)
        return res

    def _evict_host(self, n: int, res: HostEviction) -> int:
        """One host eviction of ``n`` tokens, added into ``res``; returns the tokens
        this call freed (the caller's shortfall test needs this call's alone)."""
        freed = 0
        if self._reclaims_dups and self.host_policy.reclaims and not self.skip_reclaim:
            r = self.host_policy.reclaim(self, n)
            # Fold into the op's result; most reclaims scan a few entries and free
            # nothing, so only the non-zero parts are added.
            if r.scanned:
                res.scanned += r.scanned
                self.stats.reclaim_scanned += r.scanned
                freed = r.freed
                if freed:
                    res.reclaimed_pass1 += r.pass1
                    res.reclaimed_pass2 += r.pass2
                if r.swept:
                    res.swept += r.swept
        ps = self.page_size
        lru = 0
        while freed < n:
            x = self.hheap.pop()
            if x is None:
                break
            k = len(x.key) * ps
            if self.rec is not None:
                self._ev("host_evict", x, n=k)
            self.stats.host_evict_tokens += k
            self._delete(x)
            freed += k
            lru += k
        if freed:
            res.lru_evicted += lru
            res.freed += freed
        return freed

    # The host-policy API (sim/policies/host.py) is TreeCore's; this tree supplies
    # the live re-check and the release of one host copy.
    @staticmethod
    def reclaimable(node: Node) -> bool:
        """The live re-check at release time: ``node`` is on both tiers and neither
        pinned by a load-back, awaiting a write-through ack nor host-locked."""
        return (node.dev and node.host and node.lb_pending is None and node.wt_pending is None
                and not node.host_lock_ref)

    def _release_host_copy(self, node: Node) -> int:
        """Free ``node``'s host copy and fold it into the digest (sem §4.4; the Rust
        core's event carries its component index, sem §4.6); returns its tokens."""
        self._set_host(node, False)
        event = (node.id + 1) * self._digest_stride + self._digest_offset
        self.digest = (self.digest * C.DIGEST_MULTIPLIER + event) & C.DIGEST_MASK
        return len(node.key) * self.page_size

    # -------------------------------------------------------------- load-back
    def load_back(self, match: Match, lid) -> LoadResult:
        """`init_load_back` after a match: starts the H->D load of the host-only tail,
        or says why not (sem §3.6; op-trace §6 load_back)."""
        anchor = match.best
        if anchor is self.root or anchor.dev:
            return _REJECTED["no_host_tail"]
        holder = self.host_lock(anchor)
        self.inc_lock(anchor)
        nodes = []
        x = anchor
        while x is not self.root and not x.dev:
            nodes.append(x)
            x = x.parent
        nodes.reverse()
        m = sum(len(x.key) for x in nodes) * self.page_size
        if m < max(1, self.load_back_threshold):
            self.dec_lock(anchor)
            self.host_unlock(holder)
            return _REJECTED["below_threshold"]
        # A node pinned by another anchor rejects the spec; for FULL it cannot be
        # among the evicted nodes walked (it has a device value), so this is a guard.
        if any(x.lb_pending is not None for x in nodes):
            self.dec_lock(anchor)
            self.host_unlock(holder)
            return _REJECTED["pinned_by_other"]
        free = self.device_capacity - self.dev_used - self.reserved
        ev = None
        if free < m:
            ev = self.evict_device(m - free)
            if self.device_capacity - self.dev_used - self.reserved < m:
                self.dec_lock(anchor)
                self.host_unlock(holder)
                return LoadResult("no_device_space", None, ev)
        self.dec_lock(anchor)
        lb = LoadBack(lid, anchor, holder, nodes, m)
        pin = self.write.pins_load_back
        ps = self.page_size
        for x in nodes:
            self._set_dev(x, True)
            if pin:
                x.lb_pending = lb
            if self.rec is not None:
                self._ev("load", x, n=len(x.key) * ps)
        for x in nodes:
            self._refresh(x)
            self._refresh(x.parent)
        self.inc_lock(anchor)
        self.loads[lid] = lb
        self.stats.load_tokens += m
        return LoadResult(None, lb, ev)

    def finish_load_back(self, lid) -> None:
        """The load ack: release both anchor locks, then unpin and register the nodes
        this load pinned, walking from the anchor up (sem §3.6 ack processing)."""
        lb = self.loads.pop(lid)
        self.dec_lock(lb.anchor)
        self.host_unlock(lb.host_lock)
        x = lb.anchor
        pin = self.write.pins_load_back
        while x is not self.root:
            if not pin:
                self._track(x)
            elif x.lb_pending is lb:
                x.lb_pending = None
                self._track(x)
            x = x.parent

    # ------------------------------------------------- storage (L3) prefetch
    # insert_host's hooks (TreeCore.insert_host)
    def _touch(self, node: Node) -> None:
        self._set_time(node, self._tick())

    def _writes_through(self) -> bool:
        return not self.write.write_back

    def _host_on(self, node: Node) -> None:
        self._set_host(node, True)

    def node_by_id(self, nid: int) -> Node | None:
        """The live node with id ``nid`` (the root included), or None. A walk: for
        replay and tests, not for the engine's hot path."""
        if nid == self.root.id:
            return self.root
        for x in self.iter_nodes():
            if x.id == nid:
                return x
        return None

    # ---------------------------------------------------------------- clone
    def lock_in(self, node: Node) -> Node:
        """The node of this tree, a clone, at the path of ``node`` (a lock held on the
        tree it was cloned from): a fork moves a running request's lock with this.
        The clone has the same nodes, so the walk lands on a node boundary."""
        path = self.path_units(node)
        x, pos = self.root, 0
        while pos < len(path):
            x = x.children[path[pos]]
            pos += len(x.key)
        return x

    # ---------------------------------------------------------------- clone
    def clone(self, maps: dict | None = None) -> "Tree":
        """An independent copy (copy-on-divergence forks a rank off with this).
        ``maps``: if given, filled with ``node(old) -> new`` and ``holder(old) -> new``
        (functions), so a caller's own references (a PrefetchBook's) can follow.

        Iterative, so deep chains (long multi-turn sessions) do not hit the
        recursion limit that ``copy.deepcopy`` would.
        """
        new = copy.copy(self)
        nmap: dict[int, Node] = {}
        stack = [self.root]
        while stack:
            x = stack.pop()
            nmap[id(x)] = copy.copy(x)
            stack.extend(x.children.values())

        def m(x):
            return None if x is None else nmap.get(id(x))

        holders: dict[int, HostLock] = {}

        def mh(h):
            if id(h) not in holders:
                nh = HostLock(m(h.anchor))
                nh.top = m(h.top)
                holders[id(h)] = nh
            return holders[id(h)]

        loads = {}
        for lid, lb in self.loads.items():
            loads[lid] = LoadBack(lid, m(lb.anchor), mh(lb.host_lock), [m(x) for x in lb.nodes], lb.tokens)
        lmap = {id(lb): loads[lid] for lid, lb in self.loads.items()}
        for x2 in nmap.values():
            x2.parent = m(x2.parent)
            x2.children = {k: m(c) for k, c in x2.children.items()}
            if x2.host_tops:
                x2.host_tops = [mh(h) for h in x2.host_tops]
            if x2.lb_pending is not None:
                x2.lb_pending = lmap[id(x2.lb_pending)]
        new.root = m(self.root)
        new.loads = loads
        new.pending_writes = {}
        for ack, pw in self.pending_writes.items():
            pw2 = PendingWrite(ack, m(pw.locked), pw.tokens)
            pw2.nodes = [m(x) for x in pw.nodes]
            new.pending_writes[ack] = pw2
        new.dups = {nid: m(x) for nid, x in self.dups.items()}
        for name, attr in (("dheap", "dtok"), ("hheap", "htok")):
            old = getattr(self, name)
            heap = _LeafHeap(old.prio, attr)
            heap.seq = old.seq
            heap.members = {m(x) for x in old.members}
            heap.heap = [(p, i, tok, m(x)) for p, i, tok, x in old.heap if id(x) in nmap]
            heapq.heapify(heap.heap)
            setattr(new, name, heap)
        new.d_leaves = new.dheap.members
        new.h_leaves = new.hheap.members
        new.stats = copy.copy(self.stats)
        new.rec = None if self.rec is None else []
        new.host_alloc_fail = None
        new.host_skew_fired = None
        # a scripted fault's hooks belong to its rank's own tree (sim.faults)
        new.__dict__.pop("_evict_host", None)
        new.__dict__.pop("release_duplicate", None)
        # The storage hook belongs to the original's book; a fork re-attaches its own
        # (and its own PrefetchBook: staged slots are copied in host_reserved).
        new.on_host_backup = None
        new.on_backup_intent = None
        new.buffer_walk = None
        new.host_policy = type(self.host_policy)()
        if maps is not None:
            maps["node"], maps["holder"] = m, mh
        return new

    # ---------------------------------------------------------------- views
    def iter_nodes(self):
        """Non-root nodes in depth-first pre-order, children by key."""
        stack = [self.root]
        while stack:
            x = stack.pop()
            if x is not self.root:
                yield x
            stack.extend(sorted(x.children.values(), key=lambda c: c.key[0], reverse=True))

    def fingerprint(self) -> tuple:
        """A structural summary two replicas agree on iff their logical states match
        (ids excluded, so that id drift alone does not count as divergence)."""
        out = []
        for x in self.iter_nodes():
            out.append((tuple(self.path_units(x)), x.dev, x.host, x.lock_ref, x.host_lock_ref))
        return (self.dev_used, self.host_used, tuple(out))

    # ---------------------------------------------------------------- check
    def check(self) -> None:
        """Every invariant SGLang's `sanity_check` asserts, recomputed from scratch."""

        def fail(node, what):
            nid = "root" if node is None or node is self.root else node.id
            raise InvariantError(f"node {nid}: {what}")

        ps = self.page_size
        dev = host = evictable = protected = count = dup = 0
        d_leaves, h_leaves = set(), set()
        seen_ids = set()
        in_flight_pins = set(self.loads.values())
        wt_unacked_loads = set()
        if not self.write.pins_load_back:
            for lb in self.loads.values():
                x = lb.anchor
                while x is not self.root:
                    wt_unacked_loads.add(x)
                    x = x.parent
        stack = [self.root]
        while stack:
            x = stack.pop()
            n_dev_children = 0
            for first, c in x.children.items():
                if c.parent is not x:
                    fail(c, "parent pointer does not point to the node holding it")
                if not c.key or c.key[0] != first:
                    fail(c, "child indexed under a unit other than its first page")
                n_dev_children += c.dev
                stack.append(c)
            if x.n_dev_children != n_dev_children:
                fail(x, f"n_dev_children {x.n_dev_children} != {n_dev_children}")
            if x is self.root:
                continue
            count += 1
            if x.id in seen_ids:
                fail(x, "duplicate node id")
            seen_ids.add(x.id)
            t = len(x.key) * ps
            if not x.dev and not x.host:
                fail(x, "holds neither a device nor a host copy")
            if x.dev and x.parent is not self.root and not x.parent.dev:
                fail(x, "device copy under a parent without one (device must be prefix-closed)")
            if x.lock_ref < 0 or x.host_lock_ref < 0:
                fail(x, "negative lock count")
            if x.dev:
                dev += t
                if x.lock_ref:
                    protected += t
                else:
                    evictable += t
            if x.host:
                host += t
                if x.dev:
                    dup += t
            if x.dev and not x.lock_ref and not n_dev_children:
                d_leaves.add(x)
            if not x.dev and x.host and not x.lock_ref and not x.host_lock_ref and not x.children:
                h_leaves.add(x)
            if x.lb_pending is not None and x.lb_pending not in in_flight_pins:
                fail(x, "pinned by a load-back that is not in flight")
            if x.wt_pending is not None and x.wt_pending not in self.pending_writes:
                fail(x, "write-through pending without an in-flight backup")
            settled = x.dev and x.host and x.wt_pending is None and x.lb_pending is None
            if settled and x.id not in self.dups and x not in wt_unacked_loads:
                fail(x, "settled duplicate missing from the duplicate map")
            if not self.write.write_back and x.host and x.parent is not self.root and not x.parent.host:
                fail(x, "write_through host copy under a parent without one")
        if count != self.n_nodes:
            fail(None, f"node count {self.n_nodes} != {count}")
        for name, have, want in (("dev", self.dev_used, dev), ("host", self.host_used, host),
                                 ("evictable", self.evictable, evictable),
                                 ("protected", self.protected, protected),
                                 ("duplicate", self.dup_tokens, dup)):
            if have != want:
                fail(None, f"{name} tokens {have} != {want}")
        if dev + self.reserved > self.device_capacity or host + self.host_reserved > self.host_capacity:
            fail(None, "a pool holds more than its capacity")
        if d_leaves != self.d_leaves:
            fail(next(iter(d_leaves ^ self.d_leaves)), "D-leaf set differs from its predicate")
        if h_leaves != self.h_leaves:
            fail(next(iter(h_leaves ^ self.h_leaves)), "H-leaf set differs from its predicate")
        for nid, x in self.dups.items():
            if x.id != nid or x.id not in seen_ids:
                fail(x, "ghost entry in the duplicate map (node deleted)")
