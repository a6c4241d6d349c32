"""What every tree shares (SGLang 0.5.23 ``unified_cache/unified_tree_core.py``,
``UnifiedTreeCore``): node ids and the logical clock, the page-wise key comparison,
a node's path from the root, the per-op event record, the device-prefix read
(``match_full_device_prefix``) and the storage refill (``insert_host``), each tree
supplying the hooks that touch its own counters.

``HybridTree`` (``hybrid.py``, the one core; ``full.py``'s ``Tree`` is it with
FULL alone) is built on it and sets ``_node_cls``, its node class.

Keys are lists of *units*; a unit is one page of ``page_size`` tokens (the token
itself at page size 1), so every walk is page-granular, as SGLang's is, and costs one
comparison per page. Token counts are ``units * page_size``.
"""

from __future__ import annotations

from typing import Iterable

from sim.errors import InvariantError
from sim.tree.results import HostInsert

# Node-id schemes (docs/OPTRACE.md §5): "optrace" (root 0, nodes 1, 2, ...: the
# op-trace contract), "sglang" (a bare Python core: sentinels 1-4, first node 5),
# "server" (a real 0.5.23 server, whose core is reset twice: first node 10), "rust" (a
# bare Rust core's handles: root 0, first node 1), "rust_server" (the Rust core of a
# started server: root 1, first node 2). Both Rust schemes fold the Rust core's digest
# event (sem §4.6).
ID_SCHEMES = ("optrace", "sglang", "server", "rust", "rust_server")
RUST_ID_SCHEMES = ("rust", "rust_server")


def id_scheme(tree_core: str, ids: str) -> str:
    """The tree's id scheme for a scenario's ``cache.tree_core`` and ``cache.ids``: the
    Rust core has no sentinels, so a bare Rust core and op-trace numbering coincide."""
    if tree_core == "python":
        return ids
    return "rust_server" if ids == "server" else "rust"


class TreeCore:
    """The clock, the id counter and the walks' helpers of a radix tree. Subclasses
    set ``_clock`` (``C.CLOCK_START``), ``_next_id`` (0), ``page_size`` and ``rec``
    (a list while recording events, else None) before building their first node."""

    _node_cls: type = object

    def _tick(self) -> float:
        """One draw of the logical clock (SGLang's ``time.monotonic()`` stand-in)."""
        t = self._clock
        self._clock = t + 1.0
        return t

    def _new_node(self, key: list, parent):
        """``UnifiedTreeNode.__init__``: the next id, then two clock draws
        (``last_access_time``, then ``creation_time``)."""
        nid = self._next_id
        self._next_id = nid + 1
        t = self._clock  # two draws of ``_tick``, inline
        t_create = t + 1.0
        self._clock = t_create + 1.0
        return self._node_cls(nid, key, parent, t, t_create)

    def skip_ids(self, k: int) -> None:
        """Consume ``k`` node ids, as any other node object built in an SGLang
        process does (the id drift of sem §5.4.d)."""
        self._next_id += k

    def tokens(self, node) -> int:
        return len(node.key) * self.page_size

    def _ev(self, kind: str, node, **extra) -> None:
        self.rec.append((kind, node, extra))

    def path_units(self, node) -> list:
        """The node's whole key from the root. A split never changes it."""
        parts = []
        while node is not None and node.parent is not None:
            parts.append(node.key)
            node = node.parent
        out = []
        for part in reversed(parts):
            out.extend(part)
        return out

    @staticmethod
    def _common(key: list, pos: int, nkey: list) -> int:
        """The units ``key[pos:]`` shares with a node's key ``nkey`` (``_key_match``,
        page-wise): a whole-slice compare first, as most walks match whole nodes."""
        n = len(nkey)
        if key[pos:pos + n] == nkey:
            return n
        i, lim = 0, min(n, len(key) - pos)
        while i < lim and key[pos + i] == nkey[i]:
            i += 1
        return i

    def device_prefix_len(self, key: list) -> int:
        """Units of ``key`` resident on device; a read that changes nothing."""
        return self.device_prefix(key)[0]

    def device_prefix(self, key: list) -> tuple:
        """``match_full_device_prefix``, a read that changes nothing (no recency, no
        split): the units of ``key`` resident on device (FULL's device values; where
        a request's own KV ends, ``prev_prefix_len``), the last whole device node on
        that path (the root when none) and its depth in units."""
        node, pos, n = self.root, 0, len(key)
        depth = 0
        while pos < n:
            child = node.children.get(key[pos])
            if child is None or not child.dev:
                break
            p = self._common(key, pos, child.key)
            pos += p
            if p < len(child.key):
                break
            node = child
            depth = pos
        return pos, node, depth

    def insert_host(self, anchor, key: list) -> HostInsert:
        """`UnifiedTreeCore.insert_host(node_id, key, host_value, hash_value)`
        (unified_tree_core.py): graft a storage prefetch's fetched ``key`` (units,
        the pages after ``anchor``'s path) onto the host tier below ``anchor``.

        SGLang calls it from `UnifiedRadixCache._handle_prefetch_result`
        (unified_radix_cache.py) with the rank-agreed completed tokens. Step by step:

        * `_touch_node(anchor)`: one clock draw, even for an empty key (which then
          returns at once: prefix 0, no node).
        * The walk: each child whose first page matches is touched (one draw, before
          a split check), matched page-wise and split where the key diverges
          (`_split_node`: as insert's split; a pending write_through publish list is
          patched). Under write_back nothing else happens to the nodes walked: the
          fetched slots for them are freed by the caller (``prefix_tokens`` counts
          every matched token), even for a device-only node, which stays
          device-only. Under write_through a node without a host copy is refilled
          with the fetched slots (host on, leaf sets, duplicate tracking); a node
          that already has one adds its tokens to ``prefix_tokens``. A backed node
          below a refilled one is SGLang's assertion, here an ``InvariantError``.
        * Key exhausted: ``node`` is the last node walked if it is not the root and
          was refilled or holds a host copy.
        * Key left: under write_through, a non-root, un-backed last node drops the
          whole refill (``dropped``; the caller frees every fetched slot). Else a new
          host-only leaf takes the rest (`_new_node(priority=node.priority)`: one id,
          two draws), and the leaf sets of it and its parent are refreshed.

        Host slots: the fetched slots are the caller's (``host_reserved``); the
        tree adopts ``refilled_tokens + new_tokens`` of them. The anchor's host lock,
        taken at `prefetch_from_storage`, is the caller's to release.
        """
        res = HostInsert()
        self._touch(anchor)
        if not key:
            return res
        ps = self.page_size
        wt = self._writes_through()
        node, pos, n = anchor, 0, len(key)
        host_prefix = 0
        refilled = None
        while pos < n:
            child = node.children.get(key[pos])
            if child is None:
                break
            self._touch(child)
            ckey = child.key
            p = self._common(key, pos, ckey)
            if p < len(ckey):
                child = self._split(child, p)
                res.split = True
            pos += p
            node = child
            if wt:
                if not child.host:
                    self._host_on(child)
                    self._refresh(child)
                    self._refresh(child.parent)
                    self._track(child)
                    refilled = child
                    res.refilled_tokens += p * ps
                    if self.rec is not None:
                        self._ev("refill", child, n=p * ps)
                else:
                    if refilled is not None:
                        raise InvariantError(
                            f"node {child.id}: write-through host-prefix invariant broken: "
                            f"backed node below refilled node {refilled.id}")
                    host_prefix += p
        res.prefix_tokens = (host_prefix if wt else pos) * ps
        if pos == n:
            if node is not self.root and (refilled is not None or node.host):
                res.node = node
            return res
        if node is not self.root and not node.host and wt:
            res.dropped = True
            return res
        leaf = self._new_node(key[pos:], node)
        leaf.priority = node.priority
        leaf.dev = False
        node.children[key[pos]] = leaf
        self.n_nodes += 1
        self._host_on(leaf)
        self._refresh(leaf)
        self._refresh(node)
        res.node = leaf
        res.new_tokens = (n - pos) * ps
        if self.rec is not None:
            self._ev("host_new", leaf, n=res.new_tokens)
        return res


    # ------------------------------------------ FULL's host-lock boundary
    # A host lock covers a segment from its anchor up to its ``top``, the node that
    # carries the boundary mark (full.py ``metadata["host_uuid"]``, sem §1.5): one
    # node until a split moves the mark to the new upper fragment. A node lists the
    # holders whose mark it carries in ``host_tops`` (None: none).
    @staticmethod
    def _mark_host_top(node, holder) -> None:
        if node.host_tops is None:
            node.host_tops = [holder]
        else:
            node.host_tops.append(holder)

    @staticmethod
    def _unmark_host_top(holder) -> None:
        top = holder.top
        top.host_tops.remove(holder)
        if not top.host_tops:
            top.host_tops = None

    @staticmethod
    def _move_host_tops(child, up) -> None:
        """A split: the marks on ``child`` move to its new upper fragment ``up``."""
        if child.host_tops:
            up.host_tops, child.host_tops = child.host_tops, None
            for holder in up.host_tops:
                holder.top = up

    # ------------------------------------------------ the host-policy API
    # What a host policy (sim/policies/host.py) sees of a tree: the duplicate map
    # (``dups``, insertion-ordered, "insert if absent", sem §2.4) and the primitives a
    # reclaim is built from. A reclaim walks ``duplicates()``, releases what it picks
    # with ``release_duplicate``, then, after the walk (the map must not change under
    # it), ``forget_duplicate``s what it released and ``sweep_stale``s the stale
    # entries it met. Each tree supplies ``reclaimable(node)`` and
    # ``_release_host_copy(node)``.
    def duplicates(self):
        """The duplicate map's nodes in map (registration) order: a live view that
        may hold stale entries (nodes no longer on both tiers, swept lazily)."""
        return self.dups.values()

    def is_evictable_dleaf(self, node) -> bool:
        """``node`` is an unlocked device leaf: the next device eviction could demote
        it without a backup (what pass 1 of the reclaim spares)."""
        return node in self.d_leaves

    def release_duplicate(self, node, pass_no: int) -> int:
        """`_release_full_host_duplicate`: free only the host copy and fold the victim
        into the digest (sem §4.4); returns the tokens freed. Leaf sets and the map do
        not change (the caller forgets the entry after its walk)."""
        k = self._release_host_copy(node)
        self.stats.reclaims += 1
        if pass_no == 1:
            self.stats.reclaim_pass1_tokens += k
        else:
            self.stats.reclaim_pass2_tokens += k
        if self.rec is not None:
            self._ev("dup_reclaim", node, n=k, **{"pass": pass_no})
        return k

    def forget_duplicate(self, node) -> None:
        """Drop ``node``'s map entry (after ``release_duplicate``); a no-op if absent."""
        self.dups.pop(node.id, None)

    def sweep_stale(self, nodes: Iterable) -> int:
        """Drop the map entries of stale ``nodes``, in the order given (each is an
        event); returns how many entries were removed."""
        swept = 0
        dups, rec = self.dups, self.rec
        for node in nodes:
            if dups.pop(node.id, None) is not None:
                swept += 1
                if rec is not None:
                    self._ev("dup_sweep", node)
        self.stats.swept += swept
        return swept


class Stats:
    """Monotone counters since the tree was built, for metrics and plots (both trees
    keep one; a hybrid tree's FULL counts). What one op did is in its result object;
    nothing needs deltas of these."""

    __slots__ = (
        "backups", "backup_tokens", "backup_failures", "demote_tokens",
        "drops", "drop_tokens", "drop_host_tokens", "drop_declined", "delete_tokens",
        "reclaim_pass1_tokens", "reclaim_pass2_tokens", "reclaims", "reclaim_scanned",
        "swept", "host_evict_tokens", "unevict_tokens", "load_tokens", "splits",
    )

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}
