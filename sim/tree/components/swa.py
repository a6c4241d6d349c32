"""The SWA component of SGLang 0.5.23's unified tree: the (FULL, SWA) tree.

Each node's SWA value is the SWA-pool peer of its FULL tokens, or a tombstone (None)
when the window no longer needs them. The rules, from
``sglang/srt/mem_cache/unified_cache/components/swa.py`` (``swa`` below) and
``unified_tree_core.py`` (``core``), are in docs/HYBRID.md §3:

* a match boundary must close a window: the SWA tokens accumulated since the last
  tombstone reach ``sliding_window`` (``swa.create_match_validator``);
* insert publishes SWA only at or past the request's ``swa_evicted`` cursor, caps a
  fresh leaf at one page-aligned window, and revives tombstones it walks over with
  the request's fresh KV (``_populate_range``, ``_maybe_split_leaf_for_swa_lock``,
  ``update_component_on_insert_overlap``);
* a lock covers the trailing window, tombstones included, and stamps a boundary
  uuid where it stops (``acquire_component_lock`` / ``release_component_lock``);
* eviction walks the SWA LRU: leaves go whole, internal nodes become tombstones.

With HiCache on (docs/HYBRID.md §5.8, write_back) each node may also hold an SWA
host slice (``host_value``): a backup writes every device-only SWA slice within one
window of the node (``_collect_unbacked_swa_nodes_in_window``), an internal victim
without a host copy is backed up first (``InternalStateBackup`` with the window's
token count, ``finish_swa_state_eviction``), a match may end on host-only SWA
(``swa_host_hit_length``), a load-back restores the window's host-only slices
(``build_hicache_transfers`` / ``commit_hicache_transfer(LOAD_BACK)``), host locks
cover the window (``acquire_component_lock(lock_host=True)``), and the SWA host
LRU is evicted per slice (``drive_host_eviction``).
"""

from __future__ import annotations

from sim import constants as C
from sim.tree.components.base import LRUList, TreeComponent
from sim.tree.hybrid import HybridInvariantError, HybridTree, HybridTreeError

_INF = float("inf")


class SWAComponent(TreeComponent):
    """swa ``SWAComponent``. ``window``: SGLang's ``swa_retain_window``
    (``max(sliding_window_size, draft_swa_window)``), in tokens; ``tail_size``: the
    smallest page-aligned size covering it (``_maybe_split_leaf_for_swa_lock``);
    ``refresh_span``: how far the LRU refresh of a match or insert end reaches
    (``refresh_lru``: window ancestors up to W + page_size); ``last_uuid``: the last
    boundary mark handed out (``next_component_uuid(SWA)``); ``evicted``: the
    inserting request's ``swa_evicted_seqlen``."""

    __slots__ = ("window", "tail_size", "refresh_span", "last_uuid", "evicted")

    name = "swa"
    priority = C.EVICTION_PRIORITY_INTERNAL["swa"]

    def __init__(self, sliding_window: int):
        if sliding_window <= 0:
            raise ValueError("SWAComponent requires a positive sliding_window_size")
        super().__init__()
        self.window = sliding_window
        self.tail_size = self.refresh_span = 0
        self.last_uuid = C.SWA_UUID_START
        self.evicted = 0

    def attach(self, tree) -> None:
        super().attach(tree)
        ps = self.ps
        self.tail_size = (self.window + ps - 1) // ps * ps
        self.refresh_span = self.window + ps

    def value_len(self, node) -> int:
        return len(node.key) * self.ps if node.aux else 0

    def value_len_of(self, node) -> int:
        return len(node.key) * self.ps

    def host_value_len(self, node) -> int:
        return len(node.key) * self.ps

    def _next_uuid(self) -> int:
        self.last_uuid += 1
        return self.last_uuid

    # ------------------------------------------------------------------ split
    def split(self, up, child) -> None:
        """swa ``redistribute_on_node_split``: the parent copies ``lock_ref``, takes
        its slice of the SWA value (or stays a tombstone), and takes over the
        boundary uuid, which marks the node's older edge."""
        up.aux_lock = child.aux_lock
        up.aux = child.aux
        up.uuid = child.uuid
        child.uuid = None
        if not self.tree.hicache:
            return
        # The host tier: host_lock_ref copied, the host slice split, the halves
        # without a device value listed in the SWA host LRU unless host-locked, and
        # the host-lock boundary moved up with the older edge.
        up.aux_host_lock = child.aux_host_lock
        if child.aux_host:
            up.aux_host = True
            hlru = self.hlru
            if not up.aux and up.aux_host_lock == 0:
                if child.hlp is not None:
                    hlru.add_after(child, up)
                else:
                    hlru.insert_mru(up)
            if not child.aux and child.aux_host_lock == 0 and child.hlp is None:
                hlru.insert_mru(child)
        up.huuid = child.huuid
        child.huuid = None

    # ------------------------------------------------------------------ match
    def match_validator(self, device_only: bool = True):
        """swa ``create_match_validator(match_device_only=True)``: a tombstone resets
        the accumulated window; a node is valid once the window is full. The count
        starts at infinity, so every node above the first tombstone is valid."""
        state = [_INF]
        ps, window = self.ps, self.window

        if not device_only:
            # HiCache: a host-only SWA slice is a valid boundary too (load_back
            # restores it before use).
            def valid_ht(node) -> bool:
                if not node.aux and not node.aux_host:
                    state[0] = 0
                    return False
                state[0] += len(node.key) * ps
                return state[0] >= window

            return valid_ht

        def valid(node) -> bool:
            if not node.aux:
                state[0] = 0
                return False  # swa_gates_prefix_match (default True)
            state[0] += len(node.key) * ps
            return state[0] >= window

        return valid

    def host_hit(self, best) -> int:
        """swa ``finalize_match_result_in_tree_core``: ``swa_host_hit_length``, the
        host-only SWA tokens within one window of ``best_match_node`` (stopping at a
        node with neither)."""
        n = hit = 0
        root, ps, window = self.root, self.ps, self.window
        x = best
        while x is not root and n < window:
            t = len(x.key) * ps
            if x.aux:
                n += t
            elif x.aux_host:
                hit += t
                n += t
            else:
                break
            x = x.parent
        return hit

    def _refresh_window(self, node) -> None:
        """``UnifiedLRUList.reset_node_and_window_ancestors_mru(node, W + page)``."""
        prev = self.lru.head
        acc, root, ps, span = 0, self.root, self.ps, self.refresh_span
        while node is not root and acc < span:
            if node.aux:
                LRUList.remove(node)
                LRUList.add_after(prev, node)
                prev = node
            acc += len(node.key) * ps
            node = node.parent

    def match_end(self, best) -> None:
        """swa ``refresh_lru(MATCH_END)``."""
        self._refresh_window(best)

    def branch(self, device_len: int, full_len: int):
        """swa ``finalize_match_result_in_tree_core``: the page-aligned FULL hit when it
        passes the SWA boundary (device prefix + host hit, no host here)."""
        aligned = full_len // self.ps * self.ps
        return aligned if aligned > device_len else None

    # ------------------------------------------------------------------ insert
    def prepare_insert(self, key, prev, res, args) -> None:
        ps = self.ps
        ev = args["swa_evicted"]
        if ev % ps or ev < 0:
            raise HybridTreeError("bad_swa_evicted")
        t = self.tree
        need = max(0, len(key) * ps - max(prev, ev))
        if need > t.aux_capacity - t.aux_used:
            raise HybridTreeError("swa_full")
        res.aux_new = need
        self.evicted = ev

    def recover_after_unevict(self, node, m_tok, start_tok, args) -> None:
        """swa ``recover_after_unevict``: ``_populate_range(cap_leaf=False)`` over the
        un-evicted node: its in-window part gets SWA from the request's fresh KV."""
        live = self._clip(node, start_tok, start_tok + m_tok)
        if live is None:
            return
        self.set_value(node, len(node.key) * self.ps)

    def _clip(self, node, start: int, end: int):
        """swa ``_clip_to_window``: the in-window start of a tombstone's span, after
        splitting off its out-of-window head; None if nothing is in the window."""
        if node.aux:
            return None
        live = start if start > self.evicted else self.evicted
        if live >= end:
            return None
        if live > start:
            self.tree._split(node, (live - start) // self.ps)
        return live

    def insert_overlap(self, node, m_tok, start_tok, prev, args) -> None:
        """swa ``update_component_on_insert_overlap``: a tombstone the insert walks
        over, past the request's own prefix, revives from the request's fresh KV
        within its window (``_recover_from_incoming``: the node adopts the fresh FULL
        ids, or keeps its locked FULL and takes their SWA peers,
        ``RecoverSWAWithLockedFull``). The revived range is consumed, not freed as a
        duplicate."""
        end = start_tok + m_tok
        if prev >= end:
            return
        live = self._clip(node, start_tok, end)
        if live is None:
            return
        self.set_value(node, end - live)

    def commit_insert(self, node, is_new_leaf, res, args) -> None:
        """swa ``commit_insert_component_data`` -> ``_populate_range(cap_leaf=True)``."""
        if not is_new_leaf:
            return
        start = res.prefix_len
        end = start + len(node.key) * self.ps
        live = self._clip(node, start, end)
        if live is None:
            return
        parent = self._cap_leaf(node)
        # Older fragments publish first so the tail stays more MRU (SWARebuild).
        if parent is not None:
            self.set_value(parent, len(parent.key) * self.ps)
        self.set_value(node, len(node.key) * self.ps)

    def _cap_leaf(self, leaf):
        """swa ``_maybe_split_leaf_for_swa_lock``: a fresh in-window leaf longer than
        one page-aligned window is split so the lower fragment holds exactly one."""
        if leaf is self.root or leaf.aux_lock > 0:
            return None
        leaf_len = len(leaf.key) * self.ps
        if leaf_len <= self.tail_size:
            return None
        return self.tree._split(leaf, (leaf_len - self.tail_size) // self.ps)

    def insert_end(self, node) -> None:
        """swa ``refresh_lru(INSERT_END)``."""
        self._refresh_window(node)

    # ------------------------------------------------------------------ locks
    def acquire_lock(self, node, host: bool = False):
        """swa ``acquire_component_lock``: +1 on every node (tombstones too) from the
        anchor up until the covered span reaches the window; the node where it does
        is stamped with a boundary uuid (reused if it has one). None: the walk
        reached the root. ``host`` (``lock_host=True``, ``acquire_host_lock``): the
        host lock instead, host slices leaving the host LRU, the boundary a
        ``host_uuid``. One walk for both, the device lock's being the hot one."""
        covered, top, root, ps, window = 0, None, self.root, self.ps, self.window
        t = self.tree
        cur = node
        while cur is not root and covered < window:
            if host:
                if cur.aux_host_lock == 0 and cur.aux_host and cur.hlp is not None:
                    self.hlru.remove(cur)
                cur.aux_host_lock += 1
            else:
                if cur.aux_lock == 0 and cur.aux:
                    n = len(cur.key) * ps
                    t.aux_evictable -= n
                    t.aux_protected += n
                cur.aux_lock += 1
            covered += len(cur.key) * ps
            top = cur
            cur = cur.parent
        if covered < window:
            return None
        if host:
            if top.huuid is None:
                top.huuid = self._next_uuid()
            return top.huuid
        if top.uuid is None:
            top.uuid = self._next_uuid()
        return top.uuid

    def release_lock(self, node, uuid, host: bool = False) -> None:
        """swa ``release_component_lock``: -1 up to the node carrying the receipt's
        uuid (to the root when it has none). ``host`` (``release_host_lock``): the
        host lock up to the ``host_uuid``; a host-only slice whose last host lock
        this was rejoins the host LRU."""
        t, root, ps = self.tree, self.root, self.ps
        cur = node
        while cur is not root:
            if host:
                ref = cur.aux_host_lock
                if ref <= 0:
                    raise HybridInvariantError(f"SWA segment release hit host_lock_ref=0 "
                                               f"on node {cur.id}")
                if ref == 1 and cur.aux_host and not cur.aux and cur.hlp is None:
                    self.hlru.insert_mru(cur)
                cur.aux_host_lock = ref - 1
                mark = cur.huuid
            else:
                ref = cur.aux_lock
                if ref <= 0:
                    raise HybridInvariantError(f"SWA segment release hit lock_ref=0 "
                                               f"on node {cur.id}")
                if ref == 1 and cur.aux:
                    n = len(cur.key) * ps
                    t.aux_evictable += n
                    t.aux_protected -= n
                cur.aux_lock = ref - 1
                mark = cur.uuid
            if ref == 1:
                t._refresh(cur)
            if uuid is not None and mark == uuid:
                break
            cur = cur.parent

    def acquire_host_lock(self, anchor):
        """swa ``acquire_component_lock(lock_host=True)``: ``acquire_lock``'s walk on
        the host lock."""
        return self.acquire_lock(anchor, True)

    def release_host_lock(self, anchor, uuid) -> None:
        """swa ``release_component_lock(lock_host=True)``: ``release_lock``'s walk on
        the host lock."""
        self.release_lock(anchor, uuid, True)

    def release_window_lock(self, receipt) -> None:
        """core ``dec_swa_lock_only`` -> swa ``release_window_lock``: drop the SWA part
        of a lock early (decode moved past the window); a node whose last SWA lock
        this was and that is now a device leaf loses its SWA value. The later
        ``dec_lock`` skips SWA. At most once per receipt."""
        if receipt.swa_released:
            raise HybridTreeError("swa_already_released")
        receipt.swa_released = True
        t, root, ps = self.tree, self.root, self.ps
        uuid = receipt.uuid
        cur = receipt.node
        while cur is not root:
            if cur.aux_lock <= 0:
                raise HybridInvariantError(f"SWA window release hit lock_ref=0 on node {cur.id}")
            cur.aux_lock -= 1
            if cur.aux_lock == 0:
                t._refresh(cur)
                if cur.aux:
                    n = len(cur.key) * ps
                    t.aux_protected -= n
                    t.aux_evictable += n
                    if t._is_dleaf(cur):
                        self.evict_component(cur)
            if uuid is not None and cur.uuid == uuid:
                break
            cur = cur.parent

    # ------------------------------------------------------------------ host tier
    def backup_nodes(self, x) -> list:
        """swa ``_collect_unbacked_swa_nodes_in_window``, reversed (oldest first): from
        ``x`` up while the covered span is under one window, stopping at a node with
        a write in flight or with neither value; the device-only slices."""
        out = []
        covered, root, ps, window = 0, self.root, self.ps, self.window
        cur = x
        while cur is not root and covered < window:
            if cur.wp is not None:
                break
            if not cur.aux and not cur.aux_host:
                break
            covered += len(cur.key) * ps
            if cur.aux and not cur.aux_host:
                out.append(cur)
            cur = cur.parent
        out.reverse()
        return out

    def needs_incremental_backup(self, x) -> bool:
        """swa ``needs_incremental_backup``."""
        return bool(self.backup_nodes(x))

    def load_nodes(self, anchor) -> list:
        """swa ``build_hicache_transfers(LOAD_BACK)``: from ``best_match_node`` up
        while under one window, the host-only slices, oldest first."""
        out = []
        n, root, ps, window = 0, self.root, self.ps, self.window
        cur = anchor
        while cur is not root and n < window:
            if not cur.aux and not cur.aux_host:
                raise HybridInvariantError(f"SWA load-back window hit node {cur.id} "
                                           f"with neither value")
            if not cur.aux:
                out.append(cur)
            n += len(cur.key) * ps
            cur = cur.parent
        out.reverse()
        return out

    def load_needed(self, anchor) -> bool:
        return bool(self.load_nodes(anchor))

    def alloc_for_load(self, nodes, ev) -> bool:
        """The SWA device slots of a load (``_resolve_device_transfers``: alloc, else
        ``_evict_swa_for_device_alloc`` for the shortfall once, then retry)."""
        k = 0
        for y in nodes:
            k += len(y.key) * self.ps
        t = self.tree
        free = t.aux_capacity - t.aux_used
        if free < k:
            t._merge(ev, t.evict(0, k - free))
        return t.aux_capacity - t.aux_used >= k

    def check(self) -> None:
        for n in self.tree.iter_nodes():
            if n.aux_lock > n.lock:
                raise HybridInvariantError(f"node {n.id}: SWA lock outside FULL's path lock")


class SWATree(HybridTree):
    """The (FULL, SWA) tree: the core with an ``SWAComponent``. ``sliding_window``:
    SGLang's ``swa_retain_window``, in tokens; ``swa_capacity``: the SWA pool in
    tokens; ``swa_host_capacity``: the host SWA pool."""

    def __init__(self, *, swa_capacity: int, sliding_window: int, page_size: int = 1,
                 swa_host_capacity: int = 0, **core):
        """``core``: ``HybridTree``'s keywords (``device_capacity``, ``record``, the
        host pool, the policies)."""
        super().__init__(SWAComponent(sliding_window), aux_capacity=swa_capacity,
                         aux_host_capacity=swa_host_capacity, page_size=page_size, **core)

    window = property(lambda self: self.aux.window, doc="the SWA window, tokens")

    def insert(self, key: list, prev: int = 0, swa_evicted: int = 0, inserted: int = 0):
        """Insert ``key`` for a request whose KV below ``prev`` tokens is the tree's
        own and whose SWA below ``swa_evicted`` it already freed
        (``InsertParams.prev_prefix_len``, ``get_evicted_seqlen(SWA)``); ``inserted``:
        ``InsertParams.inserted_len`` (write_through hit counts)."""
        return super().insert(key, prev, inserted, swa_evicted=swa_evicted)

    def release_swa(self, receipt) -> None:
        """core ``dec_swa_lock_only``: ``SWAComponent.release_window_lock``."""
        self.aux.release_window_lock(receipt)
