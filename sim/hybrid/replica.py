"""A hybrid tree as one TP rank's replica in the engine (docs/HYBRID.md §10).

The TP engine (``sim.events``) drives ``sim.tree.Tree`` through a small interface
(``sim.replica_api.Replica``; tests/test_replica_api.py holds the engine to it):
``match_prefix`` -> ``last_device``/``device_len``/``host_len``, ``inc_lock``/``dec_lock``
on what the match (or an insert, or a load-back) handed out, ``insert(key, priority,
resident)`` -> ``node``/``host.scanned``/``writes``, ``evict_device(n)`` ->
``backups``/``reclaim_scanned``/``host.freed``, ``load_back``/``finish_load_back``,
the ledgers ``available()`` reads (``device_capacity``, ``dev_used``, ``reserved``
(written by ``sim.allocator.KVAllocator`` only), ``evictable``), ``digest``,
``stats``, ``clone``, ``lock_in``, ``skip_ids``. ``HybridReplica`` gives a
``MambaTree`` or an ``SWATree`` that interface, so the engine's scheduler, syncs,
forks, collectives and verdicts run unchanged on a hybrid model.

What a hybrid needs beyond it (a running request holds a Mamba state slot and SWA
tokens outside the tree; evictions per component; Mamba's copy on write) is in
``HybridHooks``, which the engine calls at a few named points (``matched``,
``rejected``, ``fit``, ``chunk_room``, ``never_admissible``, ``alloc_extend``,
``before_insert``, ``released``, ``headroom``, ``decode_fits``, ``decode_evict``,
``decoded``). Each cites the SGLang 0.5.23 function it follows (files under
``sglang/srt/``). The hooks hold no engine: what they read of the run's
configuration is a ``HookSettings`` fixed at construction, and a hook that evicts or
cannot allocate returns it (a ``HookResult``: the eviction to charge, the
out-of-memory refusal) for the engine to charge and refuse.

Recording (``run --record-ops``), each replica writes its own hybrid op-trace
(docs/HYBRID.md §6.2, §10.5): every op as the replica applies it, with the KV held
outside the tree.

Locks. ``Tree.inc_lock(node)`` has no receipt; a hybrid lock has one
(``LockReceipt``: SWA's boundary uuid). The replica hands out a fresh ``Handle`` per
match, insert and load-back; ``inc_lock(h)`` stores the receipt on it and
``dec_lock(h)`` releases exactly that receipt, so the engine, which passes the same
object it locked to the unlock, needs no change. A fork moves handles to the clone
with ``lock_in``.

Transfers. A backup or load-back moves FULL tokens and, for Mamba, one state per
node; the copy engines price bytes as tokens of the FULL pool's geometry
(``CostModel.d2h_time(tokens)``), so a state counts as ``state_tokens`` =
ceil(state bytes / FULL bytes per token) tokens (``HybridConfig.state_tokens``).
For SWA with a host tier, a backup also writes the SWA slices of its window and a
load-back restores the window's host-only slices: ``k`` SWA tokens count as
ceil(k x SWA bytes / FULL bytes per token) tokens (``HybridConfig.swa_bytes`` /
``full_bytes``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from sim.errors import InvariantError
from sim.hybrid.kinds import HYBRID_KINDS
from sim.scheduler import NO_TOKEN
from sim.tree import NO_HOST_EVICTION, Eviction, HostEviction
from sim.tree.results import HybridCow


class _Write:
    """One write_through backup the engine copies D->H (``sim.tree.PendingWrite``'s
    fields the engine reads): its ack id and its size in FULL-token equivalents."""

    __slots__ = ("ack_id", "tokens")

    def __init__(self, ack_id, tokens: int):
        self.ack_id = ack_id
        self.tokens = tokens


class Handle:
    """What the engine locks: a node and, while locked, its receipt (and, recording,
    the op-trace lock id and the key of the match that handed it out)."""

    __slots__ = ("node", "receipt", "lid", "key")

    def __init__(self, node, key=None):
        self.node = node
        self.receipt = None
        self.lid = None
        self.key = key


class _Match:
    __slots__ = ("m", "last_device", "device_len", "host_len", "aux_host_len", "key")

    def __init__(self, m, key):
        self.m = m
        self.key = key
        self.last_device = Handle(m.dnode, key)
        self.device_len = m.device_len
        self.host_len = m.host_len
        self.aux_host_len = m.aux_host_len


def _sum_host(a: HostEviction, b: HostEviction) -> HostEviction:
    """Two ops' host evictions as one (the fields the engine reads: freed, scanned)."""
    if b is NO_HOST_EVICTION:
        return a
    if a is NO_HOST_EVICTION:
        return b
    he = HostEviction()
    he.freed = a.freed + b.freed
    he.scanned = a.scanned + b.scanned
    return he


class _Insert:
    """``Insert``'s fields the engine reads (no write-through writes: write_back)."""

    __slots__ = ("node", "host", "writes")

    def __init__(self, node, host=NO_HOST_EVICTION, key=None):
        self.node = Handle(node, key)
        self.host = host
        self.writes = ()


class _Load:
    """``LoadResult``'s fields: ``tokens`` is the request's prefix gain (up to the
    anchor), ``extra`` what else the H->D copy carries (the loaded FULL tokens and
    restored states, in state-equivalent tokens, beyond ``tokens``)."""

    __slots__ = ("ok", "reason", "tokens", "anchor", "eviction", "extra", "state")

    def __init__(self, ok, reason, tokens, anchor, eviction, extra=0, state=False):
        self.ok, self.reason, self.tokens, self.anchor = ok, reason, tokens, anchor
        self.eviction, self.extra, self.state = eviction, extra, state


class InsertFor:
    """The request an insert is made for (``HybridHooks.before_insert`` prepares it,
    ``HybridReplica.insert`` takes it): its id, the prefix it reused
    (``cache_protected_len``, tokens), whether it finished, and what preparing it
    evicted from host. ``refused``: the out-of-memory message when the Mamba fork's
    slot could not be allocated (the engine halts the run), else None."""

    __slots__ = ("rid", "prev", "final", "host", "refused")

    def __init__(self, rid, prev: int, final: bool):
        self.rid = rid
        self.prev = prev
        self.final = final
        # Mamba: the host evictions of the eviction that made room for the fork's
        # slot, which the insert's result carries (its reclaim scans are charged as
        # result processing; a blocking backup it made is counted, not timed)
        self.host = NO_HOST_EVICTION
        self.refused = None


class ReqState:
    """One running request's hybrid state on one replica: whether it holds a Mamba
    state slot; SWA: its own SWA tokens and its out-of-window cursor
    (``swa_evicted_seqlen``)."""

    __slots__ = ("holds", "swa_own", "cursor", "gap", "inserted")

    def __init__(self):
        self.holds = False
        self.inserted = 0    # Mamba: req.kv.cache_inserted_len (write_through hit counts)
        self.gap = 0         # Mamba: FULL KV matched past the last usable state
        self.swa_own = 0
        self.cursor = 0


class HybridReplica:
    """One rank's hybrid tree behind ``sim.tree.Tree``'s engine-facing interface.

    ``reserved`` (FULL tokens running requests hold outside the tree) and, for SWA,
    ``swa_reserved`` shrink the tree's own capacities, so the tree's room checks
    (an insert's ``device_full``, a load-back's FULL room) see what SGLang's
    allocator sees."""

    # never perturbed: scripted faults are refused on hybrid models (sim.scenario)
    digest_xor = 0

    def __init__(self, h, cfg, tree=None):
        self.h = h
        self.kind = h.kind
        self.k = HYBRID_KINDS[h.kind]  # what differs per kind (sim.hybrid.kinds)
        self.page_size = cfg.page_size
        self._cap = cfg.device_tokens
        self._reserved = 0
        self.swa_reserved = 0
        self.reqs: dict[int, ReqState] = {}
        if tree is None:
            tree = self._build(h, cfg)
        self.t = tree
        # The replica's hybrid op-trace (docs/HYBRID.md §6, with the engine's
        # extensions of §10.5), or None when not recording.
        self.ops: list | None = None
        self._pending = None  # a match not yet written: (key, cow request id)
        self._lids = 0
        if cfg.record_ops:
            self.ops = []
            if h.id_offset:
                self.ops.append({"op": "skip_ids", "n": h.id_offset})

    @staticmethod
    def _build(h, cfg):
        t = HYBRID_KINDS[h.kind].build(h, cfg)
        t.skip_ids(h.id_offset)
        return t

    # ---------------------------------------------------------------- ledgers
    @property
    def device_capacity(self) -> int:
        return self._cap

    @device_capacity.setter
    def device_capacity(self, v: int) -> None:
        self._cap = v
        self._sync_cap()

    @property
    def reserved(self) -> int:
        return self._reserved

    @reserved.setter
    def reserved(self, v: int) -> None:
        self._reserved = v
        self._sync_cap()

    def _sync_cap(self) -> None:
        ps = self.page_size
        self.t.device_capacity = self._cap // ps * ps - self._reserved

    def set_swa_reserved(self, v: int) -> None:
        self.swa_reserved = v
        self.t.aux_capacity = self.h.aux_capacity - v

    @property
    def host_capacity(self) -> int:
        return self.t.ht.host_capacity if self.t.hicache else 0

    @host_capacity.setter
    def host_capacity(self, v: int) -> None:
        self.t.ht.host_capacity = v

    dev_used = property(lambda self: self.t.dev_used)
    evictable = property(lambda self: self.t.evictable)
    protected = property(lambda self: self.t.protected)
    n_nodes = property(lambda self: self.t.n_nodes)
    stats = property(lambda self: self.t.stats)
    root = property(lambda self: self.t.root)
    host_used = property(lambda self: self.t.host_used if self.t.hicache else 0)
    digest = property(lambda self: self.t.digest if self.t.hicache else 0)
    dups = property(lambda self: self.t.dups if self.t.hicache else {})
    loads = property(lambda self: self.t.loads if self.t.hicache else {})
    pending_writes = property(lambda self: self.t.writes if self.t.hicache else {})
    host_alloc_fail = None

    @property
    def dup_tokens(self) -> int:
        if not self.t.hicache:
            return 0
        ps = self.page_size
        return sum(len(x.key) for x in self.t.dups.values()) * ps

    @property
    def content_hash(self) -> int:
        """What ``sim.verdict.state`` compares every iteration besides the FULL
        ledgers: the component's ledgers and the requests' slots (cheap; the whole
        structure is compared by ``fingerprint`` at the checks that ask for it)."""
        t = self.t
        return hash((t.aux_used, t.aux_evictable, t.aux_protected, len(t.d_leaves),
                     getattr(t, "held", 0), self.swa_reserved,
                     t.aux_host_used if t.hicache else 0,
                     len(t.h_leaves) if t.hicache else 0))

    def fingerprint(self):
        return self.t.fingerprint()

    def check(self) -> None:
        """The tree's invariants (ledgers, leaf sets, LRUs, locks, host tier), then the
        running requests' hold on the pools: the FULL pool's reservation, and the
        Mamba slots (SWA tokens) the requests hold against what the ledgers say and
        what the component's pool has. Raises ``InvariantError`` naming the first
        one broken."""
        t = self.t
        t.check()
        if not 0 <= self.reserved or t.dev_used > self.device_capacity - self.reserved:
            raise InvariantError(f"FULL pool: {t.dev_used} tokens in the tree, {self.reserved} "
                                 f"reserved by requests, capacity {self.device_capacity}")
        cap = self.h.aux_capacity
        if self.k.request_state:
            held = sum(1 for s in self.reqs.values() if s.holds)
            if held != t.held or t.aux_used + t.held > cap:
                raise InvariantError(f"Mamba pool: {held} requests hold a slot, the pool "
                                     f"counts {t.held} held and {t.aux_used} in the tree, "
                                     f"capacity {cap}")
        else:
            own = sum(s.swa_own for s in self.reqs.values())
            if own != self.swa_reserved or t.aux_used + own > cap:
                raise InvariantError(f"SWA pool: requests own {own} tokens, "
                                     f"{self.swa_reserved} reserved for them, {t.aux_used} "
                                     f"in the tree, capacity {cap}")

    def path_units(self, handle) -> list:
        return self.t.path_units(handle.node)

    def skip_ids(self, k: int) -> None:
        if self.ops is not None:
            self._rec({"op": "skip_ids", "n": k})
        self.t.skip_ids(k)

    def clone(self, maps=None) -> "HybridReplica":
        self._flush()
        new = copy.copy(self)
        new.t = self.t.clone()
        new.reqs = {rid: copy.copy(s) for rid, s in self.reqs.items()}
        if self.ops is not None:
            new.ops = list(self.ops)
        return new

    # ---------------------------------------------------------------- op-trace
    def _units_tokens(self, key: list) -> list:
        """A key's units as op-trace tokens: the unit itself at page size 1, else
        ``page_size`` tokens ``u * page_size + j`` (equal pages give equal tuples)."""
        ps = self.page_size
        if ps == 1:
            return list(key)
        return [u * ps + j for u in key for j in range(ps)]

    def _rec(self, op: dict) -> None:
        """Append ``op`` with the KV running requests hold outside the tree (the
        FULL ``reserved`` tokens, SWA's ``swa_reserved``), which shrink what the
        tree may use during the op."""
        self._flush()
        op["reserved"] = self._reserved
        if self.k.windowed:
            op["swa_reserved"] = self.swa_reserved
        self.ops.append(op)

    def _flush(self) -> None:
        """A match the engine did not lock: a plain ``match`` op."""
        p = self._pending
        if p is not None:
            self._pending = None
            op = {"op": "match", "tokens": self._units_tokens(p[0])}
            if p[1] is not None:
                op["cow"] = p[1]
            self._rec(op)

    def header(self, cfg) -> dict:
        """The op-trace header of this replica (docs/HYBRID.md §6)."""
        h = self.h
        out = {"op": "header", "components": ["full", self.kind],
               "device_capacity": cfg.device_tokens // cfg.page_size * cfg.page_size,
               "page_size": cfg.page_size}
        if self.k.windowed:
            out.update(swa_capacity=h.aux_capacity, sliding_window=h.window)
            if self.t.hicache:
                out.update(hicache=True, host_capacity=h.host_tokens,
                           swa_host_capacity=h.aux_host,
                           load_back_threshold=cfg.load_back_threshold)
                if self.t.ht.wt:
                    out["write_policy"] = self.t.write_policy
        else:
            out.update(mamba_capacity=h.aux_capacity, mamba_chunk=h.mamba_chunk)
            if h.max_states != -1:
                out["mamba_max_states"] = h.max_states
            if self.t.hicache:
                out.update(hicache=True, host_capacity=h.host_tokens,
                           mamba_host_capacity=h.aux_host,
                           load_back_threshold=cfg.load_back_threshold)
                if self.t.ht.wt:
                    out["write_policy"] = self.t.write_policy
        return out

    def trace(self, cfg) -> list:
        self._flush()
        return [self.header(cfg)] + list(self.ops)

    def lock_in(self, handle) -> Handle:
        """``handle`` (a lock taken on the tree this replica was cloned from) on this
        replica: the same node id, the receipt moved (``receipt_in``)."""
        if handle.receipt is None:
            raise InvariantError("moving an unlocked handle to a clone")
        r = self.t.receipt_in(handle.receipt)
        h = Handle(r.node, handle.key)
        h.receipt = r
        h.lid = handle.lid
        return h

    # ---------------------------------------------------------------- ops
    def _priced(self, ev: Eviction) -> Eviction:
        """The tree's ``ev`` as the engine reads an eviction: each blocking backup's
        (FULL tokens, component units) priced in FULL-token equivalents."""
        out = Eviction()
        out.freed, out.aux, out.host = ev.freed, ev.aux, ev.host
        out.backups = [full + self._equiv(aux) for full, aux in ev.backups]
        return out

    @staticmethod
    def _moved(ev: "Eviction | None") -> bool:
        """Whether an eviction made a backup or evicted from host (what costs time)."""
        return ev is not None and (bool(ev.backups) or ev.host is not NO_HOST_EVICTION)

    def _equiv(self, aux: int) -> int:
        """The component's ``aux`` host units as FULL-pool tokens of the same bytes:
        Mamba ``aux`` states of ``state_tokens`` each; SWA ceil(aux x SWA bytes /
        FULL bytes per token)."""
        return self.k.host_equiv(self.h, aux)

    def match_prefix(self, key: list) -> _Match:
        if self.ops is not None:
            self._flush()
            self._pending = (key, None)
        m = _Match(self.t.match_prefix(key), key)
        self.t.rec.clear()
        return m

    def inc_lock(self, handle: Handle) -> None:
        if self.ops is not None:
            self._lids += 1
            handle.lid = f"l{self._lids}"
            p, self._pending = self._pending, None
            if p is not None and p[0] is handle.key:
                # the match just made, pinned: one lock op (with its copy on write)
                op = {"op": "lock", "tokens": self._units_tokens(handle.key), "id": handle.lid}
                if p[1] is not None:
                    op["cow"] = p[1]
            else:
                # an insert's target or a load-back's anchor: that node itself
                self._pending = p
                self._flush()
                op = {"op": "lock", "tokens": self._units_tokens(self.t.path_units(handle.node)),
                      "id": handle.lid, "exact": True}
            self._rec(op)
        handle.receipt = self.t.inc_lock(handle.node)

    def dec_lock(self, handle: Handle) -> None:
        if self.ops is not None:
            self._rec({"op": "unlock", "id": handle.lid})
        self.t.dec_lock(handle.receipt)
        handle.receipt = None

    def release_swa(self, handle: Handle) -> None:
        """``UnifiedRadixCache.release_swa``: the SWA part of a lock, early, once."""
        if self.ops is not None:
            self._rec({"op": "release_swa", "id": handle.lid})
        self.t.hy.swa_early_releases += 1
        self.t.release_swa(handle.receipt)

    def cow(self, match: _Match, rid, holds: bool) -> HybridCow:
        """The copy on write of ``match`` for request ``rid`` (recorded with the
        match it belongs to)."""
        mine = self.ops is not None and self._pending is not None and self._pending[0] is match.key
        if mine:
            self._pending = (match.key, rid)
        r = self.t.cow(match.m, holds)
        if r.failed and mine:
            self._pending = (match.key, None)  # the trace's cow would refuse the op
        return r

    def alloc_slot(self, rid) -> None:
        """``alloc_req_slots``: request ``rid`` takes a fresh state slot."""
        if self.ops is not None:
            self._rec({"op": "alloc", "id": rid})
        self.t.held += 1

    def release_slot(self, rid) -> None:
        """A request leaving without caching frees its slot."""
        if self.ops is not None:
            self._rec({"op": "release", "id": rid})
        self.t.release()

    def evict(self, full: int, aux: int) -> Eviction:
        """cache ``evict`` with per-component requests (FULL tokens, SWA tokens or
        Mamba states); the result carries the op's blocking backups."""
        if self.ops is not None and (full or aux):
            op = {"op": "evict"}
            if full:
                op["full"] = full
            if aux:
                op[self.kind] = aux
            self._rec(op)
        res = self.t.evict(full, aux)
        self.t.rec.clear()
        return self._priced(res)

    def evict_device(self, n: int) -> Eviction:
        return self.evict(n, 0)

    def insert(self, key: list, priority: int = 0, resident: bool = False,
               req: "InsertFor | None" = None) -> _Insert:
        """``checkpoint_into_tree``'s insert for request ``req`` (what
        ``HybridHooks.before_insert`` returned: the request, its reused prefix
        ``cache_protected_len`` and whether it finished)."""
        rid, prev, final = req.rid, req.prev, req.final
        t = self.t
        host = req.host  # the scans and frees of the Mamba fork's eviction, if any
        if self.k.request_state:
            st = self.reqs.pop(rid, None) if final else self.reqs.get(rid)
            donated = final and st is not None and st.holds
            # InsertParams.inserted_len (req.kv.cache_inserted_len): gates only
            # write_through's hit counts; 0 again after a retraction (a fresh state)
            inserted = st.inserted if st is not None else 0
            if self.ops is not None:
                op = {"op": "insert", "tokens": self._units_tokens(key), "prev": prev}
                if donated:
                    op["donate"] = rid
                if inserted and t.hicache and t.ht.wt:
                    op["inserted"] = inserted
                self._rec(op)
            res = t.insert(key, prev, donated=donated, inserted=inserted)
            if st is not None and not final:
                st.inserted = max(inserted, len(key) * self.page_size)
        else:
            st = self.reqs.pop(rid, None) if final else self.reqs.get(rid)
            ev = max(prev, st.cursor if st else 0)
            # InsertParams.inserted_len (req.kv.cache_inserted_len): write_through only
            inserted = st.inserted if (st is not None and t.hicache and t.ht.wt) else 0
            short = len(key) * self.page_size - ev - (t.aux_capacity - t.aux_used)
            if short > 0:
                # The insert publishes its in-window SWA (SWARebuild): room first.
                if self.ops is not None:
                    self._rec({"op": "evict", "swa": short})
                host = _sum_host(host, t.evict(0, short).host)
            if self.ops is not None:
                op = {"op": "insert", "tokens": self._units_tokens(key), "prev": prev,
                      "swa_evicted": ev}
                if inserted:
                    op["inserted"] = inserted
                self._rec(op)
            res = t.insert(key, prev, swa_evicted=ev, inserted=inserted)
            if st is not None and not final and t.hicache and t.ht.wt:
                st.inserted = max(inserted, len(key) * self.page_size)
        t.rec.clear()
        ins = _Insert(res.node, _sum_host(host, res.host), key)
        if res.writes:
            # write_through: the insert's backups, each a D->H write acked through
            # the engine's sync (``writing_check``)
            ins.writes = [_Write(w.ack_id, w.tokens + self._equiv(w.aux)) for w in res.writes]
        return ins

    def load_back(self, match: _Match, lid, rid) -> _Load:
        """cache ``init_load_back`` + ``load_back`` for request ``rid`` (Mamba: a
        request without a slot gets one for a host-only state, ``prepare_load_back``)."""
        t = self.t
        st = self.reqs.get(rid)
        holds = bool(st and st.holds) if self.k.request_state else None
        if self.ops is not None:
            op = {"op": "load_back", "tokens": self._units_tokens(match.key), "id": lid}
            if holds is not None:
                op["req"] = rid
            self._rec(op)
        r = t.load_back(match.m, lid, holds)
        t.rec.clear()
        ev = self._priced(r.eviction) if self._moved(r.eviction) else None
        if r.slot_granted:
            self.reqs.setdefault(rid, ReqState()).holds = True
        if not r.started:
            return _Load(False, r.reason, 0, None, ev)
        anchor = match.m.best
        n, restored = r.loaded, r.aux_loaded
        gain = len(t.path_units(anchor)) * self.page_size - match.device_len
        if self.k.windowed:
            # restored: the SWA tokens the window's restore carries
            t.hy.swa_load_tokens += restored
            moved = n + self._equiv(restored)
            t.hy.swa_host_hit_tokens += gain
            if restored:
                t.hy.host_hits_with_swa += 1
            else:
                t.hy.host_hits_full_only_swa += 1
            return _Load(True, None, gain, Handle(anchor, match.key), ev, moved - gain,
                         bool(restored))
        t.hy.state_loads += restored
        moved = n + self._equiv(restored)
        t.hy.host_hit_tokens += gain
        if restored:
            t.hy.host_hits_with_state += 1
        else:
            t.hy.host_hits_full_only += 1
        return _Load(True, None, gain, Handle(anchor, match.key), ev, moved - gain,
                     bool(restored))

    def finish_load_back(self, lid) -> None:
        if self.ops is not None:
            self._rec({"op": "load_back_ack", "id": lid})
        self.t.finish_load_back(lid)
        self.t.rec.clear()

    def finish_write_through(self, ack_id) -> None:
        """``writing_check`` -> ``_finish_write_through_ack`` for one write_through
        backup (HybridTree ``write_ack``)."""
        if self.ops is not None:
            self._rec({"op": "write_ack", "id": ack_id})
        self.t.write_ack(ack_id)
        self.t.rec.clear()

    def summary(self) -> dict:
        """summary.json ``hybrid``: the component's pool and the hybrid counters."""
        t = self.t
        out = {"kind": self.kind, "aux_capacity": self.h.aux_capacity,
               "aux_used": t.aux_used}
        if self.k.request_state:
            out["held_slots"] = t.held
            out["host_states"] = self.h.aux_host if t.hicache else 0
            out["host_states_used"] = t.aux_host_used if t.hicache else 0
        elif t.hicache:
            out["host_swa_tokens"] = self.h.aux_host
            out["host_swa_used"] = t.aux_host_used
        out.update(t.hy.as_dict(self.kind, t.hicache))
        if self.k.windowed and t.hicache:
            out["swa_backup_bytes"] = t.hy.swa_backup_tokens * self.h.swa_bytes
            out["swa_load_bytes"] = t.hy.swa_load_tokens * self.h.swa_bytes
        if self.k.request_state:
            out["state_backup_bytes"] = t.hy.state_backups * self.h.state_bytes
            out["state_load_bytes"] = t.hy.state_loads * self.h.state_bytes
        return out


@dataclass(frozen=True, slots=True)
class HookSettings:
    """What the hybrid hooks read of the run's configuration, fixed for the run:
    the hybrid tree's config, the page size, whether prefill is chunked
    (``scheduler.chunked_prefill_tokens`` set) and ``clip_max_new_tokens``."""

    hybrid: "HybridConfig"
    page_size: int
    chunked: bool
    clip_max_new_tokens: int

    @classmethod
    def of(cls, cfg) -> "HookSettings":
        """The settings of ``cfg`` (a ``SimConfig`` with ``hybrid`` set)."""
        return cls(cfg.hybrid, cfg.page_size, cfg.chunked_prefill_tokens is not None,
                   cfg.clip_max_new_tokens)


class HookResult:
    """What a hybrid hook asks the engine to do, in this order: charge ``eviction``
    (an ``Eviction`` priced as the engine reads one: its blocking backups and reclaim
    scans go on the pass's plan; None: nothing to charge), then, when ``refused`` is
    set, halt the run out of memory with that message. ``fits``: ``decode_fits``'s
    answer (True elsewhere)."""

    __slots__ = ("eviction", "refused", "fits")

    def __init__(self, eviction: "Eviction | None" = None, refused: "str | None" = None,
                 fits: bool = True):
        self.eviction = eviction
        self.refused = refused
        self.fits = fits

    def __repr__(self) -> str:
        return f"HookResult(eviction={self.eviction!r}, refused={self.refused!r}, fits={self.fits})"


class _FixedResult(HookResult):
    """A shared, read-only ``HookResult`` (``NOTHING``, ``NO_ROOM``): the answer of
    a hook that evicted nothing, which saves an allocation per call (``decode_evict``
    runs every decode step)."""

    __slots__ = ()

    def __init__(self, fits: bool):
        for name, v in (("eviction", None), ("refused", None), ("fits", fits)):
            object.__setattr__(self, name, v)

    def __setattr__(self, name, value):
        raise AttributeError("a shared HookResult is read-only")


NOTHING = _FixedResult(True)   # nothing to charge, nothing refused; fits
NO_ROOM = _FixedResult(False)  # decode_fits: nothing charged, the step does not fit


class HybridHooks:
    """The engine's hybrid admission and allocation rules, per replica. Each hook
    is a no-op where the component has nothing to do. A hook never calls into the
    engine: one that evicts or cannot allocate returns a ``HookResult``."""

    def __init__(self, settings: HookSettings):
        self.cfg = settings
        self.h = settings.hybrid
        self.k = HYBRID_KINDS[self.h.kind]
        self.ps = settings.page_size
        self._pass = None      # the prefill pass whose SWA offset ``_swa_offset`` is
        self._swa_offset = 0
        self._swa_host_hit = 0  # SWA: the last match's swa_host_hit_length

    # ------------------------------------------------------------ admission
    def matched(self, c, rq, m) -> HookResult:
        """``init_next_round_input`` -> ``match_kv_cache(cow_mamba=True)`` ->
        mamba ``finalize_match_result_in_cache``: a candidate matching a device
        state copies it into a slot of its own, allocated (evicting one state if
        the pool is full) unless it holds one. Returns that eviction to charge when
        it backed up or evicted from host."""
        tree = c.tree
        if not tree.k.request_state:
            self._swa_host_hit = m.aux_host_len
            return NOTHING
        st = tree.reqs.get(rq.r.rid)
        holds = bool(st and st.holds)
        t = tree.t
        # FULL KV the walk found (on either tier) past the prefix a state makes usable
        gap = m.m.full_len - max(m.device_len + m.host_len,
                                 len(t.path_units(m.m.best)) * self.ps)
        if gap > 0:
            (st if st is not None else tree.reqs.setdefault(rq.r.rid, ReqState())).gap = gap
        # r.failed: SGLang asserts "Can not alloc mamba cache"; here the request gets
        # its slot at allocation instead (alloc_req_slots), or the batch stops there.
        r = tree.cow(m, rq.r.rid, holds)
        copied = r.copied
        t.rec.clear()
        if copied:
            t.hy.cows += 1
            if not holds:
                tree.reqs.setdefault(rq.r.rid, ReqState()).holds = True
        if tree._moved(r.eviction):
            return HookResult(tree._priced(r.eviction))
        return NOTHING

    def rejected(self, c, rq) -> None:
        """A candidate ``add_one_req`` refused: its slot from the copy on write is
        freed (``_get_new_batch_prefill_raw``: "revert matched mamba idx")."""
        tree = c.tree
        st = tree.reqs.pop(rq.r.rid, None)
        if st is not None and st.holds:
            tree.release_slot(rq.r.rid)

    def _swa_tokens(self, extend: int, max_new: int, host_hit: int = 0) -> int:
        """prefill_budget.py ``estimate_swa_kv_tokens``: a request's peak SWA, its
        page-ceiled extend's tail past one window plus a window (or less) and a page,
        plus the page-ceiled ``swa_host_hit_length`` a load-back restores."""
        ps, w = self.ps, self.h.window
        ext = -(-extend // ps) * ps
        out = max(ext - w, 0) + min(ext + max_new, w) + ps
        if host_hit > 0:
            out += -(-host_hit // ps) * ps
        return out

    def fit(self, c, plan, sel, prefix: int, max_new: int):
        """``SWAPrefillBudget.check_prefill``'s SWA half for an admission ``sel``
        (extend, max_new_tokens, chunked): the request's peak SWA below what the SWA
        pool has free or evictable less this pass's offset, charged to the offset;
        otherwise, when it could never fit the pool (``swa_never_fits``) and prefill
        is chunked, a chunk cut to what fits (``_chunk_cap``); else ``NO_TOKEN``."""
        tree = c.tree
        if not tree.k.windowed:
            return sel
        if self._pass is not plan:
            self._pass, self._swa_offset = plan, 0
        ps, t = self.ps, tree.t
        extend = sel[0]
        hit = self._swa_host_hit
        remaining = (self.h.aux_capacity - tree.swa_reserved - t.aux_used + t.aux_evictable
                     - self._swa_offset)
        need = self._swa_tokens(extend, max_new, hit)
        if need < remaining:
            self._swa_offset += need
            return sel
        if not self.cfg.chunked or need < self.h.aux_capacity:
            return NO_TOKEN
        cap = max(0, (remaining - self._swa_tokens(0, max_new, hit)) // ps * ps)
        ext = (prefix + min(extend, cap)) // ps * ps - prefix
        if ext <= 0:
            return NO_TOKEN
        self._swa_offset += self._swa_tokens(ext, max_new, hit)
        return ext, 0, True

    def after_load(self, sel, fill: int, prefix: int, promised: int, loaded: int,
                   out_len: int):
        """``add_one_req`` after ``init_load_back`` loaded more than the promised
        ``host_hit_length`` (resident FULL exposed behind a host-only SWA slice or
        Mamba state): the approved budget is kept and the work shrinks to what is
        left past the new prefix (managers/schedule_policy.py ``add_one_req``, for
        any auxiliary component)."""
        if loaded <= promised:
            return sel
        extend, max_new, chunked = sel
        extend = min(extend, fill - prefix)
        still = chunked and prefix + extend < fill
        if chunked and not still:
            max_new = min(out_len, self.cfg.clip_max_new_tokens)
        return extend, max_new, still

    def chunk_room(self, c, plan, room: int) -> int:
        """``SWAPrefillBudget.available_chunk_tokens`` for the continuing chunk: also
        below what the SWA pool has free or evictable, less a page; 0 or less: no
        room, the chunk waits for decode to free some."""
        tree = c.tree
        if not tree.k.windowed:
            return room
        if self._pass is not plan:
            self._pass, self._swa_offset = plan, 0
        t, ps = tree.t, self.ps
        swa = (self.h.aux_capacity - tree.swa_reserved - t.aux_used + t.aux_evictable
               - self._swa_offset - ps)
        room = min(room, swa // ps * ps)
        if room > 0:
            self._swa_offset += room
        return room

    def never_admissible(self, rq) -> bool:
        """Without chunked prefill, a request whose peak SWA reaches the whole SWA
        pool can never be admitted (``swa_never_fits`` and no chunk to cut): it is
        aborted as one too long for the FULL pool is."""
        if not self.k.windowed or self.cfg.chunked:
            return False
        max_new = min(max(rq.r.output_len - rq.generated, 0), self.cfg.clip_max_new_tokens)
        return self._swa_tokens(rq.fill_len, max_new) >= self.h.aux_capacity

    # ------------------------------------------------------------ allocation
    def alloc_extend(self, c, plan) -> HookResult:
        """``alloc_for_extend``'s hybrid half, before the batch's FULL eviction:
        ``alloc_req_slots`` -> ``ensure_mamba_capacity`` (a slot for every request
        without one, evicting the shortfall of states first); SWA: the batch's new
        SWA pages (``SWATokenToKVPoolAllocator.alloc``, the SWA shortfall evicted).
        Returns the shortfall's eviction to charge and, when even after it the
        pool cannot take the batch, the refusal (nothing is then allocated)."""
        tree = c.tree
        t = tree.t
        ps = self.ps
        if tree.k.request_state:
            for rq in plan.reqs:
                st = tree.reqs.get(rq.r.rid)
                if st is not None and st.gap:
                    t.hy.state_misses += 1
                    t.hy.state_miss_tokens += st.gap
                    st.gap = 0
            need = [rq for rq in plan.reqs
                    if not (tree.reqs.get(rq.r.rid) and tree.reqs[rq.r.rid].holds)]
            if not need:
                return NOTHING
            ev = None
            free = t.aux_capacity - t.aux_used - t.held
            if free < len(need):
                ev = tree.evict(0, len(need) - free)
                free = t.aux_capacity - t.aux_used - t.held
            if free < len(need):
                return HookResult(ev, f"alloc_req_slots: {len(need)} Mamba state slots "
                                      f"wanted, {free} free")
            for rq in need:
                tree.reqs.setdefault(rq.r.rid, ReqState()).holds = True
                tree.alloc_slot(rq.r.rid)
            return NOTHING if ev is None else HookResult(ev)
        new = 0
        for rq, (_, done, extend) in zip(plan.reqs, plan.shape):
            new += -(-(done + extend) // ps) * ps - -(-done // ps) * ps
        ev = None
        short = new - (self.h.aux_capacity - tree.swa_reserved - t.aux_used)
        if short > 0 and t.aux_evictable:
            ev = tree.evict(0, short)
        if new > self.h.aux_capacity - tree.swa_reserved - t.aux_used:
            return HookResult(ev, f"SWA prefill out of memory: {new} tokens wanted")
        for rq, (_, done, extend) in zip(plan.reqs, plan.shape):
            st = tree.reqs.setdefault(rq.r.rid, ReqState())
            st.swa_own += -(-(done + extend) // ps) * ps - -(-done // ps) * ps
        tree.set_swa_reserved(tree.swa_reserved + new)
        return NOTHING if ev is None else HookResult(ev)

    # ------------------------------------------------------------ results
    def before_insert(self, c, rq, prev: int, up_to: int, final: bool) -> "InsertFor":
        """``checkpoint_into_tree``'s component preparation: the insert reuses the
        request's ``cache_protected_len`` (``prev``); Mamba forks the request's state
        (unfinished) or donates it (finished, ``prepare_for_caching_req``); SWA:
        ``free_out_of_window_slots`` (SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS,
        on by default) moves the cursor to a page-aligned window below the insert's
        end, and the request's own SWA passes to the tree. Returns what the replica's
        ``insert`` takes for this request (``refused`` set when the fork's slot
        could not be allocated: the engine halts the run out of memory)."""
        tree = c.tree
        req = InsertFor(rq.r.rid, prev, final)
        if tree.k.request_state:
            st = tree.reqs.get(rq.r.rid)
            t = tree.t
            if not (final and st is not None and st.holds) and not t._free_slot():
                # prepare_for_caching_req -> _alloc_mamba_slot: the fork's slot,
                # evicting one state when the pool is full.
                # Its reclaim scans reach the insert's result (``host.scanned``, charged
                # as result processing); a blocking backup it makes is counted in the
                # stats but not timed (docs/HYBRID.md §10, simplifications).
                t.hy.insert_state_evictions += 1
                if tree.ops is not None:
                    tree._rec({"op": "evict", "mamba": 1})
                req.host = t.evict(0, 1).host
                if not t._free_slot():
                    req.refused = (f"Can not alloc mamba cache: {t.aux_capacity} state slots, "
                                   f"{t.held} held by requests, every cached state locked")
            return req
        st = tree.reqs.setdefault(rq.r.rid, ReqState())
        if not final:
            self._advance(tree, st, up_to)
        st.cursor = max(st.cursor, prev)
        tree.set_swa_reserved(tree.swa_reserved - st.swa_own)
        st.swa_own = 0
        return req

    def _advance(self, tree, st, end: int) -> None:
        """``free_swa_out_of_window_slots``: the cursor moves to
        ``end - ceil_align(max(window, page), page)``, page aligned."""
        ps = self.ps
        w_al = -(-max(self.h.window, ps) // ps) * ps
        cur = max(st.cursor, (end - 1 - w_al) // ps * ps)
        st.cursor = cur

    def released(self, c, rq) -> None:
        """``release_kv_cache(checkpoint=False)``: a retracted (or aborted) request's
        Mamba slot and own SWA go back to their pools."""
        tree = c.tree
        st = tree.reqs.pop(rq.r.rid, None)
        if st is None:
            return
        if tree.k.request_state:
            if st.holds:
                tree.release_slot(rq.r.rid)
        else:
            tree.set_swa_reserved(tree.swa_reserved - st.swa_own)

    # ------------------------------------------------------------ decode
    def _swa_room(self, tree) -> int:
        t = tree.t
        return self.h.aux_capacity - tree.swa_reserved - t.aux_used

    def headroom(self, c, batch, limit: int) -> int:
        """SWA: decode steps before one whose new SWA pages (at most one page per
        request a step) may not be free; a step never takes more, so the steps of a
        run of this length would not have evicted one by one either."""
        tree = c.tree
        if not tree.k.windowed:
            return limit
        per = len(batch) * self.ps
        return min(limit, max(0, self._swa_room(tree)) // per)

    def decode_fits(self, c, need: int) -> HookResult:
        """``check_decode_mem``'s SWA half: the step's new SWA pages (one per request
        at a page boundary, as FULL's) fit after evicting the SWA shortfall; when
        they do not (``fits`` False), the engine retracts as for FULL. Returns the
        shortfall's eviction to charge."""
        tree = c.tree
        if not tree.k.windowed:
            return NOTHING
        short = need - self._swa_room(tree)
        if short > 0 and tree.t.aux_evictable:
            ev = tree.evict(0, short)
            return HookResult(ev, fits=self._swa_room(tree) >= need)
        return NOTHING if self._swa_room(tree) >= need else NO_ROOM

    def decode_evict(self, c, batch) -> HookResult:
        """``alloc_for_decode``'s SWA half for one step: evict the SWA shortfall of a
        page per request. Returns that eviction to charge."""
        tree = c.tree
        if not tree.k.windowed:
            return NOTHING
        short = len(batch) * self.ps - self._swa_room(tree)
        if short > 0 and tree.t.aux_evictable:
            return HookResult(tree.evict(0, short))
        return NOTHING

    def decoded(self, c, batch) -> None:
        """After decode steps: each request's own SWA is its committed KV past its
        cursor, the cursor kept one page-aligned window below the sequence end
        (``maybe_evict_swa`` -> ``free_swa_out_of_window_slots`` every step). With
        ``release_prefill_swa`` (SGLANG_OPT_RELEASE_PREFILL_SWA), a request whose
        decode steps reached the window releases its lock's SWA part
        (``release_swa_prefix_lock``, when the lock's window stopped short of the
        root); it only makes SWA evictable, which nothing reads within a run of
        steps, so releasing at the run's end is what releasing at the step does."""
        tree = c.tree
        if not tree.k.windowed:
            return
        ps = self.ps
        total = tree.swa_reserved
        release = self.h.release_prefill_swa
        for rq in batch:
            if release and rq.generated - 1 >= self.h.window:
                h = rq.slots[id(c)].lock
                r = h.receipt
                if r is not None and r.uuid is not None and not r.swa_released:
                    tree.release_swa(h)
            st = tree.reqs.get(rq.r.rid)
            if st is None:
                continue
            self._advance(tree, st, rq.kv)
            slot = rq.slots[id(c)]
            low = max(slot.in_tree, st.cursor)
            own = max(0, -(-rq.kv // ps) * ps - low)
            total += own - st.swa_own
            st.swa_own = own
        tree.set_swa_reserved(total)


__all__ = ["NOTHING", "NO_ROOM", "Handle", "HookResult", "HookSettings", "HybridHooks",
           "HybridReplica", "InsertFor"]
