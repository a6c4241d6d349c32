"""buffer_only host memory mode: the host pool as a staging buffer between device and
storage (docs/STORAGE.md §3, §9), one replica's bookkeeping.

What SGLang 0.5.23 does (``mem_cache/buffer_mode/pipeline.py``, ``BufferModePipeline``;
``mem_cache/buffer_mode/storage_existence_cache.py``; the ``buffer_mode`` branches of
``mem_cache/unified_radix_cache.py``), and what each piece here stands for:

* ``ExistenceBeliefs``: ``PoolExistenceBeliefs`` of the KV pool: an LRU of page keys
  believed stored (``add``, ``contains`` touches) plus refcounted in-flight keys
  (``track_inflight`` at a D2H launch, ``untrack_inflight`` at the storage ack);
  ``covered`` is either. Writes are deduplicated against it.
* ``HostBuffer``: the host pool's slots, on a ``simpy.Container`` (level = free slots):
  write staging (``write_staged_tokens_``) and prefetch bounces
  (``prefetch_tokens_occupied``, granted at the hit in buffer mode) take from it, the
  storage-write ack and the consumed bounce's H2D ack give back.
* ``BufferBook``: a ``PrefetchBook`` whose prefetches hold no tree state during the
  fetch (``prefetch_from_storage``: no host lock, no occupancy at issue, no rate limit at
  issue), whose hits are parked when they do not fit (``pending_hit_allocs``) instead of
  revoked, whose completion parks the bounce (``stage_completed_prefetch``:
  ``_StagedPrefetch``, nothing inserted) and whose storage writes come from the write
  FIFO (``enqueue_backup_intent`` / ``flush_pending_writes`` / ``finish_backup_ack`` /
  ``finish_storage_write_ack``). The engine (``sim.events``) does the tree side: the
  D2H launch locks the node (``Tree.stage_buffer_backup``), the splice at admission is a
  plain ``insert`` (``_insert_loaded_prefix``).
"""

from __future__ import annotations

from collections import OrderedDict, deque

import simpy

from sim import constants as C
from sim.storage import policy
from sim.storage.prefetch import Hit, Issue, Prefetch, PrefetchBook, PrefetchError
from sim.tree import HostEviction, Match, Tree


def device_anchor(tree: Tree, key: list) -> tuple[int, object, int]:
    """``match_full_device_prefix`` (a read: no recency, no split): the device-resident
    tokens of ``key``, the last whole device node on that path and its depth in tokens
    (``anchor_tokens``; 0 with the root)."""
    ps = tree.page_size
    pos, anchor, depth = tree.device_prefix(key)
    return pos * ps, (None if anchor is tree.root else anchor), depth * ps


class ExistenceBeliefs:
    """``PoolExistenceBeliefs``: page keys believed stored (LRU, ``max_entries``) and
    the in-flight ones (refcounts, D2H launch to storage ack)."""

    __slots__ = ("max_entries", "entries", "inflight")

    def __init__(self, max_entries: int = C.EXISTENCE_CACHE_MAX_ENTRIES):
        self.max_entries = max_entries
        self.entries: OrderedDict = OrderedDict()
        self.inflight: dict = {}

    def add(self, keys) -> None:
        e = self.entries
        for k in keys:
            e[k] = None
            e.move_to_end(k)
        for _ in range(len(e) - self.max_entries):
            e.popitem(last=False)

    def contains(self, key) -> bool:
        if key not in self.entries:
            return False
        self.entries.move_to_end(key)
        return True

    def covered(self, keys) -> bool:
        """Every key believed stored or in flight; touches the believed ones."""
        e, inf = self.entries, self.inflight
        for k in keys:
            if k in e:
                e.move_to_end(k)
            elif k not in inf:
                return False
        return True

    def track_inflight(self, keys) -> None:
        inf = self.inflight
        for k in keys:
            inf[k] = inf.get(k, 0) + 1

    def untrack_inflight(self, keys) -> None:
        inf = self.inflight
        for k in keys:
            n = inf.get(k, 0) - 1
            if n <= 0:
                inf.pop(k, None)
            else:
                inf[k] = n

    def invalidate_beyond(self, keys, keep: int) -> None:
        """``invalidate_beyond``: forget the keys past the first ``keep``."""
        for k in keys[keep:]:
            self.entries.pop(k, None)

    def copy(self) -> "ExistenceBeliefs":
        new = ExistenceBeliefs(self.max_entries)
        new.entries = OrderedDict(self.entries)
        new.inflight = dict(self.inflight)
        return new


class HostBuffer:
    """The host pool's slots as a SimPy container (level: free slots). Every take is a
    gate the caller has already checked (``fits``), so the get succeeds at once."""

    __slots__ = ("env", "box", "peak")

    def __init__(self, env: simpy.Environment, tokens: int, free: int | None = None):
        self.env = env
        cap = max(tokens, 1)
        self.box = simpy.Container(env, capacity=cap, init=cap if free is None else free)
        self.peak = 0

    @property
    def size(self) -> int:
        return int(self.box.capacity)

    @property
    def used(self) -> int:
        return int(self.box.capacity - self.box.level)

    def fits(self, n: int) -> bool:
        return n <= self.box.level

    def take(self, n: int) -> None:
        if n <= 0:
            return
        if n > self.box.level:
            raise PrefetchError("host_buffer_overdrawn")
        self.box.get(n)  # immediate: the level covers it
        self.peak = max(self.peak, self.used)

    def give(self, n: int) -> None:
        if n > 0:
            self.box.put(n)  # immediate: never above capacity

    def copy(self, env: simpy.Environment) -> "HostBuffer":
        new = HostBuffer(env, self.size, int(self.box.level))
        new.peak = self.peak
        return new


class Intent:
    """``_UnifiedBackupIntent``: a node queued for a write, its identity snapshot
    (key length) and its page keys (chained from its parent at enqueue)."""

    __slots__ = ("node", "length", "keys")

    def __init__(self, node, length: int, keys: list):
        self.node = node
        self.length = length
        self.keys = keys


class Staged:
    """``_StagedPrefetch``: a completed fetch parked until its request's admission:
    ``matched`` tokens the prefetch anchored after, ``tokens`` fetched, the bounce's
    ``occupied`` slots, and the anchor pin (a node, or None)."""

    __slots__ = ("matched", "tokens", "occupied", "pin", "pin_tokens")

    def __init__(self, matched, tokens, occupied, pin, pin_tokens):
        self.matched = matched
        self.tokens = tokens
        self.occupied = occupied
        self.pin = pin
        self.pin_tokens = pin_tokens


class BufferBook(PrefetchBook):
    """The buffer_only prefetch and write bookkeeping of one replica's tree.

    ``host``: the host buffer; ``device_pool``: the device pool (tokens), for the
    write backlog cap (2x) and the anchor-lock cap
    (``max(0, min(int(0.5 * pool), pool - max_context_len))``)."""

    def __init__(self, tree: Tree, host: HostBuffer, threshold: int = C.PREFETCH_THRESHOLD_DEFAULT,
                 *, device_pool: int = 0, max_context_len: int = 0):
        super().__init__(tree, threshold,
                         policy.prefetch_capacity_limit(host.size, "buffer_only"))
        self.host = host
        self.device_pool = device_pool
        self.max_context_len = max_context_len
        self.beliefs = ExistenceBeliefs()
        # write path
        self.queue: deque = deque()       # pending_write_queue (FIFO, head-of-line)
        self.inflight_nodes: set = set()  # inflight_backup_pools: queued to storage ack
        self.backlog = 0                  # write_backlog_tokens_ (queued intents)
        self.backlog_cap = C.BUFFER_WRITE_BACKLOG_FACTOR * device_pool
        self.write_staged = 0             # write_staged_tokens_
        self.staging: dict = {}           # D2H ack id (node id) -> (tokens, keys)
        self.walk: set | None = None      # nodes admitted in this insert walk
        # read path
        self.parked: deque = deque()      # pending_hit_allocs (pids)
        self._hits: dict = {}             # pid -> its rank-agreed hit (tokens)
        self.matched: dict = {}           # pid -> tokens matched at issue
        self.pins: dict = {}              # pid -> (anchor node, tokens) (anchor_locks)
        self.pinned = 0                   # anchor_locked_tokens_
        self.pin_cap = max(0, min(int(C.BUFFER_ANCHOR_LOCK_CAP * device_pool),
                                  device_pool - max_context_len))
        self.staged: dict = {}            # pid -> Staged (staged_prefetches)
        self.record = None                # op-trace hook: the pin / unpin ops
        self.loading: dict = {}           # load id -> bounce slots (ongoing_buffer_load_back)
        self.counts = {"writes_staged": 0, "writes_deduplicated": 0, "writes_dropped": 0,
                       "hits_parked": 0, "prefetches_staged": 0, "spliced_tokens": 0,
                       "staged_dropped": 0}

    def held_ids(self) -> set:
        """Running, parked and staged prefetches, and the hits, matches and anchor pins
        still kept by id."""
        return set().union(self.prefetches, self.parked, self.staged, self._hits,
                           self.matched, self.pins)

    # ---------------------------------------------------------------- prefetch
    def issue(self, pid, match: Match, key: list) -> Issue:
        """``prefetch_from_storage`` in buffer mode: the anchor is the device match
        (``_prefetch_kvcache``: nothing is host-backed, so a root ``last_host_node``
        moves to ``last_node``); no host lock, no occupancy, no rate limit here."""
        if pid in self.prefetches or pid in self.staged:
            raise PrefetchError("duplicate_prefetch_id")
        tree = self.tree
        anchor = match.last_device
        pos = match.device_len // tree.page_size
        rest = key[pos:]
        requested = len(rest) * tree.page_size
        # the threshold checks only: buffer mode skips `prefetch_rate_limited` at issue
        # (occupancy is granted at the hit), so the occupied count passed is 0 of 1
        reason = policy.issue_decision(requested, self.threshold, 0, 1)
        if reason is not None:
            return Issue(reason, anchor, requested)
        p = Prefetch(pid, anchor, None, rest, requested)
        self.prefetches[pid] = p
        self.matched[pid] = match.device_len
        return Issue(None, anchor, requested, p)

    def hit(self, pid, hit_tokens: int, key: list | None = None) -> Hit:
        """The rank-agreed hit (``_drain_and_alloc_storage_hit``): below the threshold
        revoked; behind a parked hit, or not fitting, parked (``reason`` "parked",
        ``staged`` 0, the prefetch kept); else staged (``_try_alloc_storage_hit``)."""
        p = self._get(pid)
        if p.staged is not None:
            raise PrefetchError("prefetch_already_staged")
        tree = self.tree
        if hit_tokens < 0 or hit_tokens % tree.page_size or hit_tokens > p.requested:
            raise PrefetchError("bad_hit")
        reason = policy.hit_decision(hit_tokens, self.threshold, terminated=False)
        if reason is not None:
            self._retire(p)
            return Hit(0, reason, HostEviction())
        self._hits[pid] = hit_tokens
        if self.parked:
            self.parked.append(pid)  # a parked hit keeps its turn
            self.counts["hits_parked"] += 1
            return Hit(0, "parked", HostEviction())
        res = self.try_alloc(pid, key)
        if res.reason == "parked":
            self.parked.append(pid)
            self.counts["hits_parked"] += 1
        return res

    def try_alloc(self, pid, key: list | None = None) -> Hit:
        """``_try_alloc_storage_hit`` in buffer mode for prefetch ``pid`` (its hit
        known): rate-limited (``prefetch_rate_limited``: occupancy at the 0.9 cap) parks;
        ``try_lock_anchor`` re-matches the device prefix of the prefetch's path plus the
        hit (``key``: the request's whole key): shrunk below the issue's match revokes
        (``anchor_lost``), a span the device already covers revokes (``device_covered``),
        a pin over the free cap parks (``cap_busy``) and one over the whole cap launches
        unpinned (``cap_skip``); a bounce bigger than the whole pool revokes
        (``host_oversize``); one that does not fit parks (``host_capacity``, the pin
        released); else the bounce's slots are taken and the transfer may start."""
        p = self.prefetches[pid]
        hit = self._hits[pid]
        tree, ps = self.tree, self.tree.page_size
        if self.occupied >= self.capacity_limit:
            return Hit(0, "parked", HostEviction())
        matched = self.matched[pid]
        pin = None
        if key is not None:
            dev, anchor, anchor_tokens = device_anchor(tree, key[: (matched + hit) // ps])
            if dev < matched:
                self._retire(p)
                return Hit(0, "anchor_lost", HostEviction())
            if dev >= matched + hit:
                self._retire(p)
                return Hit(0, "device_covered", HostEviction())
            if anchor_tokens:
                if self.pinned + anchor_tokens > self.pin_cap:
                    if anchor_tokens <= self.pin_cap:
                        return Hit(0, "parked", HostEviction())  # cap_busy
                    # cap_skip: launches unpinned
                else:
                    pin = (anchor, anchor_tokens)
        if hit > self.host.size:
            self._retire(p)
            return Hit(0, "host_oversize", HostEviction())
        if not self.host.fits(hit):
            return Hit(0, "parked", HostEviction())
        if pin is not None:
            if self.record is not None:
                self.record({"op": "pin", "key": tree.path_units(pin[0]), "id": pid})
            tree.inc_lock(pin[0])
            self.pins[pid] = pin
            self.pinned += pin[1]
        self.host.take(hit)
        self.occupied += hit
        p.staged = hit
        return Hit(hit, None, HostEviction())

    def done(self, pid, completed: int):
        """``stage_completed_prefetch``: nothing is inserted; the bounce of the
        ``completed`` tokens is parked for admission and its keys feed the beliefs
        (``keys``: the fetched page keys, given by the caller through ``done_keys``).
        The tail past ``completed`` is freed now. Returns (None, staged tokens)."""
        p = self._get(pid)
        if p.staged is None:
            raise PrefetchError("prefetch_not_staged")
        ps = self.tree.page_size
        if completed < 0 or completed % ps or completed > p.staged:
            raise PrefetchError("bad_done")
        tail = p.staged - completed
        self.host.give(tail)
        self.occupied -= tail
        del self.prefetches[pid]
        self._hits.pop(pid, None)
        pin = self.pins.pop(pid, (None, 0))
        if completed == 0:
            self._unpin(pin, pid)
            self.matched.pop(pid, None)
            return None, 0
        self.staged[pid] = Staged(self.matched.pop(pid), completed, completed, *pin)
        self.counts["prefetches_staged"] += 1
        return None, completed

    def _unpin(self, pin, pid) -> None:
        node, tokens = pin
        if node is not None:
            if self.record is not None:
                self.record({"op": "unpin", "id": pid})
            self.tree.dec_lock(node)
            self.pinned -= tokens

    def _retire(self, p: Prefetch) -> None:
        if p.staged:
            self.host.give(p.staged)
            self.occupied -= p.staged
        self._unpin(self.pins.pop(p.pid, (None, 0)), p.pid)
        self._hits.pop(p.pid, None)
        self.matched.pop(p.pid, None)
        if p.pid in self.parked:
            self.parked.remove(p.pid)
        del self.prefetches[p.pid]

    def consume(self, pid) -> Staged | None:
        """The request's staged bounce at admission (``prepare_staged_prefetch``), its
        anchor pin released (``release_anchor_lock``); the caller then splices it or
        drops it (``drop_staged``)."""
        f = self.staged.pop(pid, None)
        if f is not None:
            self._unpin((f.pin, f.pin_tokens), pid)
            f.pin = None
        return f

    def drop_staged(self, f: Staged) -> None:
        self.host.give(f.occupied)
        self.occupied -= f.occupied
        self.counts["staged_dropped"] += 1

    def loaded(self, lid, f: Staged) -> None:
        """The bounce is read by an H2D load ``lid``: freed at its ack."""
        self.loading[lid] = f.occupied

    def load_ack(self, lid) -> None:
        """``try_finish_load_back``: the H2D ack frees the bounce and its occupancy."""
        n = self.loading.pop(lid)
        self.host.give(n)
        self.occupied -= n

    def clone(self, tree: Tree, maps: dict, host: HostBuffer | None = None) -> "BufferBook":
        node = maps["node"]
        new = BufferBook(tree, host or self.host, self.threshold, device_pool=self.device_pool,
                         max_context_len=self.max_context_len)
        new.capacity_limit = self.capacity_limit
        new.occupied = self.occupied
        for pid, p in self.prefetches.items():
            q = Prefetch(pid, node(p.anchor), None, p.key, p.requested)
            q.staged = p.staged
            new.prefetches[pid] = q
        new.writes = {wid: (node(x), h) for wid, (x, h) in self.writes.items()}
        new.beliefs = self.beliefs.copy()
        # a queued node evicted since keeps its (detached) object: the flush retires it
        new.queue = deque(Intent(node(i.node) or i.node, i.length, i.keys) for i in self.queue)
        new.inflight_nodes = set(self.inflight_nodes)
        new.backlog, new.write_staged = self.backlog, self.write_staged
        new.staging = dict(self.staging)
        new.parked = deque(self.parked)
        new.matched = dict(self.matched)
        new.pins = {pid: (node(x), t) for pid, (x, t) in self.pins.items()}
        new.pinned = self.pinned
        new.staged = {pid: Staged(f.matched, f.tokens, f.occupied, node(f.pin), f.pin_tokens)
                      for pid, f in self.staged.items()}
        new.loading = dict(self.loading)
        new._hits = dict(self._hits)
        new.counts = dict(self.counts)
        new.record = None  # the fork's engine re-attaches it
        return new

    # ---------------------------------------------------------------- writes
    def write(self, wid, node) -> bool:
        """A storage write from a node's staging (``finish_backup_ack`` ->
        ``write_storage``): only the node whose D2H launch took the staging writes
        (a split fragment rides its lower piece's write)."""
        if wid in self.writes:
            raise PrefetchError("duplicate_storage_write_id")
        entry = self.staging.pop(node.id, None)
        if entry is None:
            return False
        self.writes[wid] = (node, entry)
        return True

    def write_keys(self, wid) -> list:
        return self.writes[wid][1][1]

    def write_ack(self, wid) -> None:
        """``finish_storage_write_ack``: the keys become beliefs, the staging is freed,
        the node leaves the in-flight set."""
        entry = self.writes.pop(wid, None)
        if entry is None:
            raise PrefetchError("unknown_storage_write_id")
        node, (tokens, keys, nid) = entry
        self.beliefs.add(keys)
        self.beliefs.untrack_inflight(keys)
        self.host.give(tokens)
        self.write_staged -= tokens
        self.inflight_nodes.discard(nid)

    def live_cap(self) -> int:
        """``flush_pending_writes``' write window: loads first, the fraction a floor."""
        pool = self.host.size
        return max(int(C.HICACHE_WRITE_STAGING_POOL_FRACTION * pool),
                   pool - self.occupied - pool // C.BUFFER_WRITE_LOADS_MARGIN_DIV)
