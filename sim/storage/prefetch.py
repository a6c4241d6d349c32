"""One replica's storage prefetches and storage writes, as the tree sees them
(docs/STORAGE.md §1; op-trace ops in docs/OPTRACE.md §14).

What SGLang 0.5.23's cache mode does to the tree around a prefetch
(mem_cache/unified_radix_cache.py), and the method here that does the same:

* ``issue``: ``Scheduler._prefetch_kvcache`` matches the request
  (``match_prefix``), anchors on ``last_host_node`` (the match's best node) only if
  it is the root or backed up, and calls ``prefetch_from_storage`` with the tokens
  after the matched prefix. That declines a key shorter than ``prefetch_threshold``
  and a rate-limited one (``prefetch_tokens_occupied >= prefetch_capacity_limit``),
  else host-locks the anchor (``inc_host_lock_ref``) and adds the key's length to the
  occupied count.
* ``hit``: the drain of ``prefetch_hit_queue`` gets the rank-agreed (MIN) hit; below
  the threshold it revokes; else ``allocate_storage_hit`` stages host slots outside
  the tree (``Tree.stage_host``), evicting the whole hit from host first when they
  do not fit, or revokes (``host_capacity``).
* ``done``: ``_handle_prefetch_result`` with the rank-agreed completed tokens:
  ``Tree.insert_host(anchor, key[:completed])``, the first ``prefix_len`` staged
  slots freed (all of them if the insert dropped), the anchor's host lock released.
* ``revoke``: ``revoke_pending_prefetch`` / ``_retire_ongoing_prefetch``: staging
  released, the anchor's host lock released.
* ``write`` / ``write_ack``: ``write_backup_storage(node_id)`` after each D->H ack
  (``_finish_write_through_ack``, every published node) host-locks the node until
  the storage ack (``ongoing_backup``, drained by ``_drain_backup``); a node without
  a host copy is not written (``build_storage_backup_spec`` returns None).

Slot movement the tree cannot see is the caller's: the staged tail past the completed
tokens is released here at ``done`` (SGLang queues it on ``host_mem_release_queue``,
drained at a later sync step).
"""

from __future__ import annotations

from sim import constants as C
from sim.storage import policy
from sim.tree import HNode, HostEviction, HostInsert, HostLockReceipt, Match, Tree


class PrefetchError(Exception):
    """A storage op the book refuses (the op-trace reports ``code``)."""

    def __init__(self, code: str):
        super().__init__(code)
        self.code = code


class Prefetch:
    """An in-flight prefetch: ``_OngoingPrefetch`` (anchor, key, staged slots)."""

    __slots__ = ("pid", "anchor", "holder", "key", "requested", "staged")

    def __init__(self, pid, anchor: HNode, holder: HostLockReceipt, key: list, requested: int):
        self.pid = pid
        self.anchor = anchor
        self.holder = holder
        self.key = key            # units after the anchor's path
        self.requested = requested  # tokens (stats_requested_tokens)
        self.staged = None        # host slots staged at the hit (None: no hit yet)


class Issue:
    """Result of ``PrefetchBook.issue``: ``reason`` None when issued; ``anchor``;
    ``requested``: the key's tokens (0 when the gate refused)."""

    __slots__ = ("reason", "anchor", "requested", "prefetch")

    def __init__(self, reason, anchor, requested, prefetch=None):
        self.reason = reason
        self.anchor = anchor
        self.requested = requested
        self.prefetch = prefetch


class Hit:
    """Result of ``PrefetchBook.hit``: ``staged`` tokens (0: revoked, ``reason``
    says why) and the host eviction the allocation ran (``host``)."""

    __slots__ = ("staged", "reason", "host")

    def __init__(self, staged, reason, host):
        self.staged = staged
        self.reason = reason
        self.host = host


class PrefetchBook:
    """The prefetch and storage-write bookkeeping of one replica's tree (cache mode).

    ``threshold``: the tree's ``prefetch_threshold`` in tokens
    (``policy.tree_prefetch_threshold``); ``capacity_limit``: the occupied-token cap
    (default ``policy.prefetch_capacity_limit(host_capacity)``)."""

    def __init__(self, tree: Tree, threshold: int = C.PREFETCH_THRESHOLD_DEFAULT,
                 capacity_limit: int | None = None):
        self.tree = tree
        self.threshold = threshold
        self.capacity_limit = (policy.prefetch_capacity_limit(tree.host_capacity)
                               if capacity_limit is None else capacity_limit)
        self.occupied = 0       # prefetch_tokens_occupied
        self.prefetches: dict = {}
        self.writes: dict = {}  # storage write id -> (node, its host lock receipt)

    # ---------------------------------------------------------------- prefetch
    def issue(self, pid, match: Match, key: list) -> Issue:
        """``key``: the request's whole key (units), ``match`` its ``match_prefix``."""
        if pid in self.prefetches:
            raise PrefetchError("duplicate_prefetch_id")
        tree = self.tree
        anchor = match.best
        if not policy.anchor_allows_prefetch(anchor is tree.root, anchor.host):
            return Issue("anchor_not_backed", anchor, 0)
        pos = (match.device_len + match.host_len) // tree.page_size
        rest = key[pos:]
        requested = len(rest) * tree.page_size
        reason = policy.issue_decision(requested, self.threshold, self.occupied, self.capacity_limit)
        if reason is not None:
            return Issue(reason, anchor, requested)
        p = Prefetch(pid, anchor, tree.host_lock(anchor), rest, requested)
        self.prefetches[pid] = p
        self.occupied += requested
        return Issue(None, anchor, requested, p)

    def held_ids(self):
        """The prefetch ids this book still holds (``StorageState.held_ids``)."""
        return self.prefetches.keys()

    def _get(self, pid) -> Prefetch:
        p = self.prefetches.get(pid)
        if p is None:
            raise PrefetchError("unknown_prefetch_id")
        return p

    def hit(self, pid, hit_tokens: int) -> Hit:
        """The rank-agreed storage hit of prefetch ``pid`` (tokens, whole pages, at
        most the requested key)."""
        p = self._get(pid)
        if p.staged is not None:
            raise PrefetchError("prefetch_already_staged")
        tree = self.tree
        if hit_tokens < 0 or hit_tokens % tree.page_size or hit_tokens > p.requested:
            raise PrefetchError("bad_hit")
        reason = policy.hit_decision(hit_tokens, self.threshold, terminated=False)
        he = HostEviction()
        if reason is None:
            def free():
                return tree.host_free

            def evict(n):
                r = tree.evict_host(n)
                for name in HostEviction.__slots__:
                    setattr(he, name, getattr(he, name) + getattr(r, name))
                return r.freed

            staged = policy.storage_hit_alloc(hit_tokens, free, evict, tree.page_size, self.threshold)
            if staged:
                p.staged = staged
                tree.stage_host(staged)
                return Hit(staged, None, he)
            reason = "host_capacity"
        self._retire(p)
        return Hit(0, reason, he)

    def done(self, pid, completed: int) -> tuple[HostInsert, int]:
        """The prefetch's rank-agreed completed tokens landed: insert them on host.
        Returns the ``HostInsert`` and the tokens loaded from storage
        (``loaded_from_storage``: ``completed - prefix_len``, 0 if dropped)."""
        p = self._get(pid)
        if p.staged is None:
            raise PrefetchError("prefetch_not_staged")
        tree = self.tree
        if completed < 0 or completed % tree.page_size or completed > p.staged:
            raise PrefetchError("bad_done")
        tree.unstage_host(p.staged)
        res = tree.insert_host(p.anchor, p.key[:completed // tree.page_size])
        tree.host_unlock(p.holder)
        self.occupied -= p.requested
        del self.prefetches[pid]
        loaded = 0 if res.dropped else completed - res.prefix_tokens
        return res, loaded

    def revoke(self, pid) -> None:
        """Drop prefetch ``pid`` without inserting anything."""
        self._retire(self._get(pid))

    def _retire(self, p: Prefetch) -> None:
        if p.staged:
            self.tree.unstage_host(p.staged)
        self.tree.host_unlock(p.holder)
        self.occupied -= p.requested
        del self.prefetches[p.pid]

    def clone(self, tree: Tree, maps: dict) -> "PrefetchBook":
        """This book on ``tree``, a ``Tree.clone(maps)`` of this book's tree."""
        node, holder = maps["node"], maps["holder"]
        new = PrefetchBook(tree, self.threshold, self.capacity_limit)
        new.occupied = self.occupied
        for pid, p in self.prefetches.items():
            q = Prefetch(pid, node(p.anchor), holder(p.holder), p.key, p.requested)
            q.staged = p.staged
            new.prefetches[pid] = q
        new.writes = {wid: (node(x), holder(h)) for wid, (x, h) in self.writes.items()}
        return new

    # ---------------------------------------------------------------- storage writes
    def write(self, wid, node: HNode) -> bool:
        """``write_backup_storage(node)``: False (nothing written) without a host copy."""
        if wid in self.writes:
            raise PrefetchError("duplicate_storage_write_id")
        if node is self.tree.root or not node.host:
            return False
        self.writes[wid] = (node, self.tree.host_lock(node))
        return True

    def write_ack(self, wid) -> None:
        """The storage ack of write ``wid`` (``_drain_backup``): release its host lock."""
        entry = self.writes.pop(wid, None)
        if entry is None:
            raise PrefetchError("unknown_storage_write_id")
        self.tree.host_unlock(entry[1])
