"""The storage tier (L3) and buffer_only as one process object of a TP group
(docs/STORAGE.md §7, §9): what the scheduler loop (``sim.events.Simulation``) asks of
storage at its named points, and the SimPy processes of storage I/O.

The Simulation holds one ``StorageEngine`` when ``storage`` is configured and calls it
at these points, each SGLang's:

* ``arrive`` (``_prefetch_kvcache``, at a request's arrival): the prefetch's issue and
  its queries on every rank's storage;
* ``sync`` (``check_hicache_events``): the sync vector with the storage queues, the
  agreed drains, and under buffer_only ``flush_pending_writes``;
* ``poll`` (``check_prefetch_progress``, at admission), ``abort`` (a request SGLang
  aborts at admission), ``buf_splice`` (``prepare_staged_prefetch``, buffer_only);
* ``buffer_insert`` (buffer_only's insert walk), ``hook`` (a forked replica's tree
  callbacks), ``wrap_up`` (the run's host-buffer figures).

Each replica's storage state is a ``sim.storage.replica.StorageState``: its
PrefetchBook, storage view and its storage engines (SimPy resources, one for reads
and queries, one for writes); every tree op is recorded as docs/OPTRACE.md §14.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from sim import consensus
from sim.collectives import CollectiveError
from sim.clock import until
from sim.request import _Halt
from sim.policies import resolve
from sim.ranks import Cohort
from sim.scheduler import available
from sim.storage.policy import PREFETCH_POLICIES
from sim.storage.replica import StorageOp

if TYPE_CHECKING:
    from sim.events import Simulation
    from sim.request import Req


class ReplicaHook:
    """A tree's (or book's) callback into the storage tier on behalf of its own
    replica: ``fn(replica, *args)``. An object rather than a closure, so that two
    replicas' hooks compare as the same method for corresponding replicas
    (``sim.coalesce``: a closure is opaque, and no two would ever be equal)."""

    __slots__ = ("fn", "replica")

    def __init__(self, fn, replica: Cohort):
        self.fn, self.replica = fn, replica

    def __call__(self, *args):
        return self.fn(self.replica, *args)


class StorageEngine:
    """One TP group's L3 tier: every replica's prefetches, storage reads and writes,
    and (buffer_only) the host pool as a staging buffer."""

    # ``reqs`` and ``hits`` are swept of ids no replica holds once ``reqs`` has
    # doubled since the last sweep (and holds this many): a long run would otherwise
    # keep every request it ever prefetched for, its page keys included.
    SWEEP_MIN = 4096

    def __init__(self, sim: "Simulation"):
        self.sim = sim
        self.config = sim.cfg.storage  # the storage tier's StorageConfig
        # --hicache-host-memory-mode buffer_only (sim.storage.buffer)
        self.buf = self.config.host_memory_mode == "buffer_only"
        self.env, self.group, self.metrics = sim.env, sim.group, sim.metrics
        self.jitter, self.collective, self.cost = sim.jitter, sim.collective, sim.cost
        self.ps, self.solo, self.rc = sim._ps, sim._solo, sim._rc
        self.op = sim._op
        # the prefetch stop policy (sim.storage.policy.PREFETCH_POLICIES)
        self.policy = resolve(PREFETCH_POLICIES, self.config.prefetch_policy, "prefetch policy")
        self.hits: dict = {}  # prefetch id -> {id(replica): its storage hit}
        self.reqs: dict = {}  # prefetch id -> its Req
        self.sweep_at = self.SWEEP_MIN  # ``reqs``' size that starts the next ``sweep``
        # The timeout votes of this iteration's admission polls (`vote`):
        # prefetch id -> the reduced verdict, and each replica's polled ids.
        self.votes: dict = {}
        self.polled: dict = {}
        self.vote_at = None  # (step, time) of the admission those belong to
        self.armed: set[float] = set()  # the prefetch deadlines whose timer runs (``alarm``)
        # The agreed progress of the prefetches polled in this admission (``completed``)
        self.landed: dict = {}
        self.landed_at = None  # (step, time) of the admission it belongs to
        for c in self.group.cohorts:
            self.attach(c)

    # ------------------------------------------------------------ the loop's points
    def sync(self) -> None:
        """`check_hicache_events` with storage on: the queues' sync and drains, then,
        under buffer_only, `flush_pending_writes` (after the drains: their acks free
        staging), the staged heads' D2H leaving now."""
        self.sync_queues()
        if self.buf:
            for c in self.group.cohorts:
                self.buf_flush(c)
                self.sim._launch_writes(c)

    def abort(self, c: Cohort, pid) -> None:
        """A request SGLang aborts at admission: its prefetch is revoked and, under
        buffer_only, its staged bounce freed (`release_staged_hold`)."""
        self.revoke(c, pid, "aborted")
        if self.buf:
            f = c.st.book.consume(pid)
            if f is not None:
                c.st.book.drop_staged(f)

    def buffer_insert(self, c: Cohort, key: list, priority: int, resident: bool,
                      inserted: int):
        """buffer_only's insert (`begin_insert_walk`): each node is admitted once per
        insert walk."""
        c.st.book.walk = c.tree.buffer_walk = set()
        try:
            return (c.tree.insert(key, priority, resident, inserted) if inserted
                    else c.tree.insert(key, priority, resident))
        finally:
            c.st.book.walk = c.tree.buffer_walk = None

    def wrap_up(self) -> None:
        if self.buf:
            # buffer_only's host-buffer figures, rank 0's replica (summary.json)
            book = self.group.cohort_of(0).st.book
            self.metrics.storage["host_buffer"] = dict(
                book.counts, size_tokens=book.host.size, peak_tokens=book.host.peak,
                used_tokens_at_end=book.host.used)

    # ------------------------------------------------------------ buffer_only
    # docs/STORAGE.md §9: the host pool as a staging buffer (sim.storage.buffer).
    def buf_intent(self, c: Cohort, node) -> None:
        """`enqueue_backup_intent` (from the insert walk's write_through trigger, root
        first): once per walk; not while queued, staged or awaiting its storage ack;
        not when every page is believed stored or in flight (deduplicated); dropped
        when its parent is neither stored nor in flight (`_backup_parent_covered`: no
        holes in the chain) or past the backlog cap."""
        from sim.storage.buffer import Intent

        book = c.st.book
        if book.walk is not None:
            if node.id in book.walk:
                return
            book.walk.add(node.id)
        if node.id in book.inflight_nodes:
            return
        keys = self.node_keys(c, node)
        if book.beliefs.covered(keys):
            book.counts["writes_deduplicated"] += 1
            return
        tokens = len(keys) * self.ps
        if book.backlog >= book.backlog_cap or not self.buf_parent_covered(c, node) \
                or tokens > book.host.size:
            book.counts["writes_dropped"] += 1
            return
        book.queue.append(Intent(node, len(node.key), keys))
        book.inflight_nodes.add(node.id)
        book.backlog += tokens

    def buf_parent_covered(self, c: Cohort, node) -> bool:
        parent = node.parent
        book = c.st.book
        return (parent is c.tree.root or parent.id in book.inflight_nodes
                or book.beliefs.contains(self.chain_key(c, parent)))

    def buf_retire(self, book, it, dropped: bool) -> None:
        book.queue.popleft()
        book.inflight_nodes.discard(it.node.id)
        book.backlog -= it.length * self.ps
        if dropped:
            book.counts["writes_dropped"] += 1

    def buf_flush(self, c: Cohort) -> None:
        """`flush_pending_writes`: stage the FIFO's heads into host slots while the
        staged writes stay under the window (`live_cap`, loads first), each node
        device-locked until its D2H ack (`Tree.stage_buffer_backup`); an evicted head
        is retired, a head whose parent lost its cover is dropped (the drop cascades
        down the chain), a head now covered retires without a write. The staged
        writes leave as one merged D->H op (`start_writing`)."""
        book = c.st.book
        if not book.queue:
            return
        tree, ps = c.tree, self.ps
        cap = book.live_cap()
        while book.queue:
            it = book.queue[0]
            x = it.node
            if (not x.dev or x.parent is None or x.parent.children.get(x.key[0]) is not x
                    or x.id in book.staging):
                self.buf_retire(book, it, dropped=True)  # evicted (`_validate_backup_intent`)
                continue
            if len(x.key) < it.length and not self.buf_split_pieces(c, it):
                self.buf_retire(book, it, dropped=True)
                continue
            it = book.queue[0]
            x = it.node
            if not self.buf_parent_covered(c, x):
                self.buf_retire(book, it, dropped=True)
                continue
            keys = it.keys
            if book.beliefs.covered(keys):
                self.buf_retire(book, it, dropped=False)
                continue
            tokens = len(keys) * ps
            if book.write_staged >= cap or not book.host.fits(tokens):
                break  # yield to live fetch demand; acks free staging
            book.queue.popleft()
            book.backlog -= it.length * ps
            book.host.take(tokens)
            book.write_staged += tokens
            book.beliefs.track_inflight(keys)
            book.staging[x.id] = (tokens, keys, x.id)
            book.counts["writes_staged"] += 1
            self.op(c, {"op": "buffer_stage", "key": tree.path_units(x)})
            pw = tree.stage_buffer_backup(x)
            self.sim._pending_writes.setdefault(id(c), []).append((pw.ack_id, tokens))

    def buf_split_pieces(self, c: Cohort, it) -> bool:
        """`_refresh_pending_backup_intents` / `_split_pieces`: the queued node was split
        (it keeps its id and the lower part): the head becomes one intent per piece,
        upper first, each with its slice of the snapshot's page keys. False when the
        pieces no longer make up the snapshot's span (an upper piece evicted)."""
        from sim.storage.buffer import Intent

        book, root = c.st.book, c.tree.root
        pieces, y, rem = [], it.node, it.length
        while rem > 0 and y is not root and y.dev:
            pieces.append(y)
            rem -= len(y.key)
            y = y.parent
        if rem != 0:
            return False
        book.queue.popleft()
        end = len(it.keys)
        for y in pieces:  # lowest first: appendleft leaves the upper piece at the head
            n = len(y.key)
            if y is it.node or y.id not in book.inflight_nodes:
                book.queue.appendleft(Intent(y, n, it.keys[end - n:end]))
                book.inflight_nodes.add(y.id)
            else:
                book.backlog -= n * self.ps  # that piece is queued or written already
            end -= n
        return True

    def agreed_hits(self, c: Cohort, n_hit: int):
        """The next ``n_hit`` queued query results of this replica, as (prefetch id, the
        page keys it queried, the rank-agreed hit in tokens: the MIN over the replicas,
        at most what was requested); a prefetch terminated meanwhile is skipped."""
        from sim.storage.collectives import min_hits

        st, book, ps = c.st, c.st.book, self.ps
        for _ in range(n_hit):
            pid = st.hit_q.popleft()
            p = book.prefetches.get(pid)
            keys = st.qkeys.pop(pid, None)
            if p is None:
                continue  # terminated meanwhile
            yield pid, keys, min(min_hits(list(self.hits[pid].values()), ps), p.requested)

    def buf_drain_hits(self, c: Cohort, n_hit: int) -> None:
        """`_drain_and_alloc_storage_hit` in buffer mode: parked hits first, FIFO
        (`pending_hit_allocs`); then the agreed hits, each healing the beliefs from its
        query (`_invalidate_absent_from_hit_query`: the chain past the hit forgotten,
        up to it believed); a hit behind a parked one, or one that does not fit,
        parks."""
        st, book, ps = c.st, c.st.book, self.ps
        while book.parked:
            pid = book.parked[0]
            res = book.try_alloc(pid, self.sim._seq_key(self.reqs[pid],
                                                    self.reqs[pid].fill_len - 1))
            if res.reason == "parked":
                break
            if book.parked and book.parked[0] == pid:
                book.parked.popleft()  # staged (a revoke has already unparked it)
            self.buf_hit_result(c, pid, res)
        for pid, keys, hit in self.agreed_hits(c, n_hit):
            if keys is not None:
                book.beliefs.invalidate_beyond(keys, hit // ps)
                book.beliefs.add(keys[: hit // ps])
            st.qkeys[pid] = keys
            rq = self.reqs[pid]
            res = book.hit(pid, hit, self.sim._seq_key(rq, rq.fill_len - 1))
            if res.reason == "parked":
                self.count(c, "prefetch_declined", "rate_limited")
                continue
            self.buf_hit_result(c, pid, res)

    def buf_hit_result(self, c: Cohort, pid, res) -> None:
        self.start_read(c, pid, c.st.qkeys.pop(pid, None), res)

    def start_read(self, c: Cohort, pid, keys, res) -> None:
        """A prefetch's hit result: the staged pages' read starts on the replica's
        read engine, or, with nothing staged, the prefetch is revoked."""
        st = c.st
        if res.staged:
            op = StorageOp("read", pid, keys, pages=res.staged // self.ps)
            st.xfers[pid] = op
            st.inflight.add(op)
            self.env.process(self.read(c, op))
        else:
            st.waits.pop(pid, None)
            self.count(c, "prefetch_revoked", res.reason)

    def buf_splice(self, c: Cohort, rq: Req, key, m, f, adder, plan, sel, lock, lid,
                    total, first):
        """`prepare_staged_prefetch` + `init_load_back` for a request with a staged
        bounce: the device prefix re-matched; shrunk below the prefetch's anchor, or
        already covering the span, the bounce is dropped (SGLang re-fetches a shrunk
        one, `_refetch_staged`: not modelled); else the staged tail past the device
        match is the request's host hit: device slots are made for it (evicting), the
        span is published at once with a plain insert (`_insert_loaded_prefix`), the
        request's lock moves to it, and an H2D from the bounce joins the batch's loads
        (its ack frees the bounce, `try_finish_load_back`)."""
        tree, ps, book = c.tree, self.ps, c.st.book
        pid = f"p{rq.r.rid}"
        dev = m.device_len
        end = f.matched + f.tokens
        if dev < f.matched or dev >= end:
            book.drop_staged(book.consume(pid))
            return sel, lock, lid, 0
        loaded = end - dev
        sel2 = adder.select(rq.fill_len, end, total, rq.r.output_len, first)
        if isinstance(sel2, str):
            return sel, lock, lid, 0  # the staged span waits for a later pass
        book.consume(pid)
        self.sim._evict_for(c, loaded, plan)
        if available(tree) < loaded:
            book.drop_staged(f)
            return sel, lock, lid, 0
        units = key[: end // ps]
        self.op(c, {"op": "insert", "key": units})
        ins = self.sim._insert(c, units, 0)
        self.op(c, {"op": "lock", "key": units, "id": lid + ".s"})
        self.op(c, {"op": "unlock", "id": lid})
        tree.dec_lock(lock)
        lock = ins.node
        tree.inc_lock(lock)
        bid = f"b{rq.r.rid}{rq.try_suffix}"
        book.loaded(bid, f)
        plan.loads.append(bid)
        plan.load_tokens += loaded
        book.counts["spliced_tokens"] += loaded
        if 0 in c.ranks:
            self.metrics.storage["l3_hit_tokens"] += loaded
            rq.l3 = loaded
        return sel2, lock, lid + ".s", loaded

    # ------------------------------------------------------------ storage (L3)
    def attach(self, c: Cohort) -> None:
        from sim.storage.prefetch import PrefetchBook
        from sim.storage.replica import StorageState
        from sim.storage.view import StorageView

        if self.buf:
            from sim.storage.buffer import BufferBook, HostBuffer

            # buffer_only (docs/STORAGE.md §9): the host pool is the staging buffer,
            # the tree holds no host values (`set_host_memory_buffer_only`)
            c.tree.buffer_only = True
            book = BufferBook(c.tree, HostBuffer(self.env, c.tree.host_capacity),
                              self.config.prefetch_threshold, device_pool=c.tree.device_capacity,
                              max_context_len=self.config.max_context_len)
        else:
            book = PrefetchBook(c.tree, self.config.prefetch_threshold)
        c.st = StorageState(self.env, book, StorageView(self.config.capacity_pages))
        self.hook(c)

    def hook(self, c: Cohort) -> None:
        c.tree.on_host_backup = ReplicaHook(self.write, c)
        if self.buf:
            c.tree.on_backup_intent = ReplicaHook(self.buf_intent, c)
            if c.ops is not None:
                # the anchor pins (`try_lock_anchor` / `release_anchor_lock`) are traced
                c.st.book.record = ReplicaHook(self.op, c)

    def count(self, c: Cohort, name: str, reason: str | None = None, n: int = 1) -> None:
        if 0 not in c.ranks:
            return  # metrics describe rank 0
        st = self.metrics.storage
        if reason is None:
            st[name] += n
        else:
            st[name][reason] = st[name].get(reason, 0) + n

    def node_keys(self, c: Cohort, node) -> list[int]:
        """The storage keys of ``node``'s own pages: ``page_keys`` of its path, the
        last ``len(node.key)`` of them, chained from the parent's last key, which the
        replica keeps per node id (`StorageState.chain`) so a write costs its own
        pages, not its whole path."""
        from sim.storage.view import page_keys

        keys = page_keys(node.key, self.chain_key(c, node.parent))
        c.st.chain[node.id] = keys[-1]
        return keys

    def chain_key(self, c: Cohort, x) -> int:
        """The storage key of the last page of ``x``'s path (0 at the root)."""
        root, chain = c.tree.root, c.st.chain
        if x is root:
            return 0
        k = chain.get(x.id)
        if k is not None:
            return k
        path = []
        while x is not root and x.id not in chain:
            path.append(x)
            x = x.parent
        k = 0 if x is root else chain[x.id]
        for y in reversed(path):
            for u in y.key:
                k = hash((k, u))
            chain[y.id] = k
        return k

    def holders(self, op):
        """The replicas awaiting ``op``'s result (it leaves their in-flight sets)."""
        cohorts = self.group.cohorts
        if len(cohorts) == 1:
            st = cohorts[0].st
            if op in st.inflight:
                st.inflight.discard(op)
                return cohorts
            return ()
        return self.holders_of(op)

    def holders_of(self, op):
        for c in self.group.cohorts:
            if op in c.st.inflight:
                c.st.inflight.discard(op)
                yield c

    def arrive(self, rq: Req) -> None:
        """`_prefetch_kvcache` at arrival, on every replica: match, `prefetch_from_storage`;
        an issued prefetch queries each rank's storage (`batch_exists`)."""
        from sim.storage.view import page_keys

        key = self.sim._seq_key(rq, rq.fill_len - 1)
        pid = f"p{rq.r.rid}"
        if len(self.reqs) >= self.sweep_at:
            self.sweep()
        self.reqs[pid] = rq
        for c in self.group.cohorts:
            # buffer_only: the prefetch holds nothing in the tree, its issue is a match
            self.op(c, {"op": "match", "key": key} if self.buf
                     else {"op": "prefetch", "key": key, "id": pid})
            m = c.tree.match_prefix(key)
            if self.rc:  # `init_next_round_input` in `_prefetch_kvcache`
                self.sim._consensus_match(c, key, m)
            iss = c.st.book.issue(pid, m, key)
            if iss.reason is not None:
                if iss.reason != "empty":  # an empty key is no attempt
                    self.count(c, "prefetch_declined", iss.reason)
                continue
            self.count(c, "prefetch_issued")
            # the key's pages after the anchor, chained from the anchor's last key
            # (its path is the matched prefix): as `page_keys(key)[matched:]`
            op = StorageOp("query", pid, page_keys(iss.prefetch.key,
                                                   self.chain_key(c, iss.anchor)))
            c.st.inflight.add(op)
            self.env.process(self.query(c, op))

    def sweep(self) -> None:
        """Forget the requests and agreed-hit inputs of prefetch ids that no replica
        holds any more (``StorageState.held_ids``). Each read of ``reqs`` or ``hits``
        is of an id held there, and an id issued again (a request arriving again) is
        entered again, so nothing read changes. Amortised over the arrivals since the
        last sweep (at least as many as it keeps)."""
        live = set().union(*(c.st.held_ids() for c in self.group.cohorts))
        self.reqs = {pid: rq for pid, rq in self.reqs.items() if pid in live}
        self.hits = {pid: h for pid, h in self.hits.items() if pid in live}
        self.sweep_at = max(self.SWEEP_MIN, 2 * len(self.reqs))

    def query(self, c: Cohort, op):
        with c.st.read.request() as req:
            yield req
            dur = self.seconds(c, self.config.backend.exists_seconds())
            yield self.env.timeout(dur)
        ps = self.ps
        for c2 in self.holders(op):
            if op.id in c2.st.book.prefetches:
                self.hits.setdefault(op.id, {})[id(c2)] = self.rank_hit(c2, op.keys) * ps
                c2.st.hit_q.append(op.id)
                c2.st.qkeys[op.id] = op.keys
            else:
                self.stale(c2, "hit_q", op.id)
        self.sim._relevant()

    def rank_hit(self, c: Cohort, keys) -> int:
        """``batch_exists`` on this replica's storage: leading pages present, cut by the
        storage faults of a single-rank replica (``jitter.storage_miss`` / ``_fail``)."""
        if self.config.unwritten_ranks and not self.config.unwritten_ranks.isdisjoint(c.ranks):
            return 0  # a shard nobody writes (attention CP, MLA: storage.attn_cp_size)
        n = c.st.view.exists(keys)
        j = self.jitter
        if n and len(c.ranks) == 1:
            r = c.ranks[0]
            if r in j.fail_ranks:
                j.perturbations.fire("storage_fail")
                return 0
            if r in j.miss_ranks:
                for i in range(n):
                    if j.page_missing(r, keys[i]):
                        j.perturbations.fire("storage_miss")
                        return i
        return n

    def read(self, c: Cohort, op):
        """`_page_transfer`: the hit in batches of 128 pages, one read call each."""
        from sim.storage.backends import prefetch_batches

        be, ps = self.config.backend, self.ps
        bpp = ps * self.cost.bytes_per_token
        with c.st.read.request() as req:
            yield req
            for pages in prefetch_batches(op.pages):
                if op.cancelled:
                    break
                dur = self.seconds(c, be.read_seconds(pages * bpp))
                yield self.env.timeout(dur)
                self.sim._relevant()
                op.completed += pages * ps
                if any(0 in x.ranks for x in self.group.cohorts if op in x.st.inflight):
                    self.metrics.storage["l3_read_bytes"] += pages * bpp
        holders = list(self.holders(op))
        for c2 in holders:  # a read hit refreshes the pages' recency (LRUFileEvictor.touch)
            c2.st.view.read(op.keys[: op.completed // ps])
        if not op.cancelled:
            for c2 in holders:
                c2.st.ack_q.append(op.id)
            self.sim._kick()
        else:
            for c2 in holders:
                self.stale(c2, "ack_q", op.id)

    def write(self, c: Cohort, node) -> None:
        """`write_backup_storage(node)` after a D->H ack (``Tree.on_host_backup``): the
        node is host-locked until its storage ack; its pages become visible to this
        rank's `batch_exists` when the write finishes."""
        if self.rc:
            consensus.record(self.sim, c, "write_backup_storage", "<no check>", "<no check>")
        st = c.st
        if self.buf:
            # `finish_backup_ack` -> `write_storage` from the staging copy
            if node.id not in st.book.staging:
                return  # a split fragment: its lower piece's write carries it
            st.n_writes += 1
            wid = f"s{st.n_writes}"
            st.book.write(wid, node)
            keys = st.book.write_keys(wid)
            op = StorageOp("write", wid, keys, len(keys))
            st.inflight.add(op)
            self.env.process(self.writer(c, op))
            return
        if node is c.tree.root or not node.host:
            return  # build_storage_backup_spec: nothing written, no id
        st.n_writes += 1
        wid = f"s{st.n_writes}"  # the op-trace's automatic ids (OPTRACE §14)
        st.book.write(wid, node)
        n = len(node.key)
        op = StorageOp("write", wid, self.node_keys(c, node), n)
        st.inflight.add(op)
        self.env.process(self.writer(c, op))

    def writer(self, c: Cohort, op):
        nbytes = op.pages * self.ps * self.cost.bytes_per_token
        with c.st.write.request() as req:
            yield req
            dur = self.seconds(c, self.config.backend.write_seconds(nbytes))
            yield self.env.timeout(dur)
        for c2 in self.holders(op):
            c2.st.view.write(op.keys)
            c2.st.wack_q.append(op.id)
            self.count(c2, "l3_write_bytes", n=nbytes)
        self.sim._relevant()

    def sync_queues(self) -> None:
        """`_sync_hicache_ready_counts` with storage on: ``[write_acks, load_acks,
        prefetch_hit, ack_prefetch, ack_backup, host_mem_release, digest, -digest]``
        MIN over the TP group; every rank drains the agreed counts, in SGLang's order."""
        group, now = self.group, self.env.now
        if self.solo:
            c = group.cohorts[0]
            self.sim._pop(c, c.ready_count(c.write_q, 0, now), c.ready_count(c.load_q, 0, now))
            self.drain(c, *c.st.queue_sizes()[:3])
            return
        if self.vote_at is not None:
            self.check_votes()
        if len(group.cohorts) == 1:
            c = group.cohorts[0]
            w, l_ = c.shared_ready_count(c.write_q, now), c.shared_ready_count(c.load_q, now)
            if w is not None and l_ is not None:
                # Every rank shares one replica and sees the same acks and queues: one
                # vector stands for all (the MIN of equal vectors), as `_sync` does.
                st, d = c.st, c.tree.digest
                red = self.collective.all_reduce_uniform(self.sim.step_no, "sync", [
                    w, l_, *st.queue_sizes(), d, -d])
                if red[0] or red[1]:
                    self.sim._pop(c, red[0], red[1])
                if red[2] or red[3] or red[4] or (self.buf and st.book.parked):
                    self.drain(c, red[2], red[3], red[4])
                return
        from sim.storage.collectives import sync_vector, unpack_sync_vector

        vecs: dict[int, list[int]] = {}
        digest: dict[int, int] = {}
        for c in group.cohorts:
            q = c.st.queue_sizes()
            d = c.tree.digest
            digest.update(dict.fromkeys(c.ranks, d))
            w, l_ = c.shared_ready_count(c.write_q, now), c.shared_ready_count(c.load_q, now)
            if w is not None and l_ is not None:
                # every rank of the replica enters with one vector object
                vecs.update(dict.fromkeys(c.ranks, sync_vector(w, l_, d, storage_queues=q)))
                continue
            for r in c.ranks:
                vecs[r] = sync_vector(c.ready_count(c.write_q, r, now),
                                      c.ready_count(c.load_q, r, now), d, storage_queues=q)
        red = self.sim._all_reduce("sync", vecs)
        self.sim._check_digest(digest, red[-2], -red[-1])
        w, l_, qs, _ = unpack_sync_vector(red)
        for c in group.cohorts:
            self.sim._pop(c, w, l_)
            self.drain(c, qs[0], qs[1], qs[2])

    def drain(self, c: Cohort, n_hit: int, n_ack: int, n_backup: int) -> None:
        st, book = c.st, c.st.book
        if self.buf:
            self.buf_drain_hits(c, n_hit)
            n_hit = 0
        for pid, keys, hit in self.agreed_hits(c, n_hit):
            self.op(c, {"op": "prefetch_hit", "id": pid, "n": hit})
            self.start_read(c, pid, keys, book.hit(pid, hit))
        for _ in range(n_ack):
            pid = st.ack_q.popleft()
            op = st.xfers.get(pid)
            if pid in book.prefetches and op is not None:
                self.done(c, pid, op.completed)
        recording = c.ops is not None and not self.buf
        for _ in range(n_backup):
            wid = st.wack_q.popleft()
            if recording:
                self.op(c, {"op": "storage_write_ack", "id": wid})
            book.write_ack(wid)

    def done(self, c: Cohort, pid, completed: int) -> None:
        """`_handle_prefetch_result`: ``insert_host`` of what landed."""
        st = c.st
        if not self.buf:
            self.op(c, {"op": "prefetch_done", "id": pid, "n": completed})
        _, loaded = st.book.done(pid, completed)
        op = st.xfers.pop(pid, None)
        if op is not None:
            op.cancelled = True  # a transfer still running stops at its next batch
        st.waits.pop(pid, None)
        if self.buf:
            if loaded and op is not None:
                # `stage_completed_prefetch`: the fetch is evidence the pages are stored
                st.book.beliefs.add(op.keys[: loaded // self.ps])
            return
        if 0 in c.ranks:
            self.metrics.storage["l3_hit_tokens"] += loaded
            self.reqs[pid].l3 = loaded

    def revoke(self, c: Cohort, pid, reason: str) -> None:
        st = c.st
        if pid not in st.book.prefetches:
            return
        if not self.buf:
            self.op(c, {"op": "prefetch_revoke", "id": pid})
        st.book.revoke(pid)
        op = st.xfers.pop(pid, None)
        if op is not None:
            op.cancelled = True
        st.waits.pop(pid, None)
        self.count(c, "prefetch_revoked", reason)

    def poll(self, c: Cohort, rq: Req) -> bool:
        done = self.poll_once(c, rq)
        if self.rc:
            consensus.record(self.sim, c, "check_prefetch_progress", f"{{'request': 'p{rq.r.rid}'}}",
                             repr(done))
        return done

    def poll_once(self, c: Cohort, rq: Req) -> bool:
        """`check_prefetch_progress` at admission: True when the request may go on
        (no prefetch, or it is terminated now: inserted if staged, else revoked).
        What has landed is the rank-agreed progress (`_st_completed`); under
        `timeout` the verdict is the TP group's MAX of every rank's vote (`_st_vote`)."""
        from sim.storage import policy

        pid = f"p{rq.r.rid}"
        st = c.st
        p = st.book.prefetches.get(pid)
        if p is None:
            return True
        cfg, now = self.config, self.env.now
        completed = self.completed(pid)
        landed = p.staged is not None and completed is not None and completed >= p.staged
        verdict = None
        if self.policy.timed and not self.solo:
            verdict = self.vote(c, pid)
        done, wait = policy.poll(self.policy, terminated=False, kv_landed=landed,
                                 wait=st.waits.get(pid), now=now, requested_tokens=p.requested,
                                 page_size=self.ps, base_s=cfg.prefetch_timeout_base,
                                 per_ki_token_s=cfg.prefetch_timeout_per_ki_token,
                                 consensus=verdict)
        if wait is not None:
            st.waits[pid] = wait
            if not done and wait.started_at is not None:
                # the first poll after the deadline (strictly later) terminates it
                self.alarm(math.nextafter(wait.started_at + wait.timeout_s, math.inf))
        if not done:
            return False
        if p.staged:
            self.done(c, pid, completed or 0)
        else:
            self.revoke(c, pid, "not_staged")
        return True

    def alarm(self, t: float) -> None:
        """A prefetch deadline at ``t`` (the first poll strictly after the timeout
        terminates the prefetch): a relevant moment then, on a timer of its own (one
        per time, however many replicas and polls arm it)."""
        if t <= self.env.now:
            self.sim._kick()
        elif t not in self.armed:
            self.armed.add(t)
            self.env.process(self.ring(t))

    def ring(self, t: float):
        yield from until(self.env, t)
        self.armed.discard(t)
        self.sim._relevant()

    def stale(self, c: Cohort, queue: str, pid) -> None:
        """Replica ``c``'s query (``hit_q``) or transfer (``ack_q``) of prefetch ``pid``
        ended after the prefetch was terminated there. SGLang's threads queue every
        op's hit and every transfer's last ack on every rank, terminated or not
        (`prefetch_thread_func` queries a terminated op as a miss;
        `prefetch_io_aux_func` sends `completed_req` in a `finally`), so the ranks'
        queues pair item for item under the sync vector's MIN counts, and each drain
        skips its stale items. Here: while some replica still runs the prefetch (its
        trees differ), ``c`` queues the stale item as SGLang does; once no replica
        does, the stale items the faster replicas queued are dropped instead, so the
        queues still pair the same ids (and one replica never holds a stale item)."""
        cohorts = self.group.cohorts
        if queue == "hit_q":
            alive = any(pid in x.st.book.prefetches for x in cohorts)
        else:
            alive = any(pid in x.st.xfers for x in cohorts)
        if alive:
            getattr(c.st, queue).append(pid)
            return
        for x in cohorts:
            q = getattr(x.st, queue)
            if pid in q:
                q.remove(pid)

    def seconds(self, c: Cohort, base_s: float) -> float:
        """One storage call's duration on this replica: the backend's figure, or, on a
        rank with a slow backend (``jitter.storage_latency``; such a rank has its own
        replica from t=0), that figure scaled plus its drawn extra delay."""
        j = self.jitter
        if not j.slow_ranks or len(c.ranks) != 1 or c.ranks[0] not in j.slow_ranks:
            return base_s
        n = c.st.calls
        c.st.calls += 1
        dur = j.storage_seconds(c.ranks[0], n, base_s)
        if dur != base_s:
            j.perturbations.fire("storage_latency")
        return dur

    def completed(self, pid) -> int | None:
        """The tokens of prefetch ``pid`` every rank agrees have landed, or None before
        its hit is staged. Each rank's `_page_transfer` sends one progressive ack per
        128-page batch; `prefetch_sync_thread_func` MIN-reduces each ack across the TP
        group (`_reduce_prefetch_ack`, a blocking collective, so the i-th ack lands on
        every rank when the slowest rank sent it) and the scheduler moves
        `operation.completed_tokens` only through the drained acks
        (`_drain_ack_prefetch`). Every rank's transfers run FIFO on its one
        `prefetch_io_aux_thread`, in the rank-agreed drain order of the hit queue, so
        the i-th ack is the same batch of the same prefetch everywhere: the agreed
        figure is the MIN over the ranks of what each has read so far."""
        # One figure per admission: every replica's poll of ``pid`` in it reads what
        # the ranks agreed before the first of them, not the MIN over the replicas
        # whose transfer is still open (a replica that terminated the prefetch
        # earlier in this admission has dropped its transfer, and without it the
        # later replicas would read a slower rank's progress as landed).
        key = (self.sim.step_no, self.env.now)
        if self.landed_at != key:
            self.landed_at = key
            self.landed.clear()
        elif pid in self.landed:
            return self.landed[pid]
        out = None
        for c in self.group.cohorts:
            op = c.st.xfers.get(pid)
            if op is not None and (out is None or op.completed < out):
                out = op.completed
        self.landed[pid] = out
        return out

    def vote(self, c: Cohort, pid) -> bool:
        verdict = self.vote_once(c, pid)
        if self.rc:
            consensus.record(self.sim, c, "_can_terminate_prefetch", "<no check>", repr(verdict))
        return verdict

    def vote_once(self, c: Cohort, pid) -> bool:
        """`_can_terminate_prefetch` under `timeout`: PP0's TP ranks each vote
        (`_prefetch_deadline_expired`: its own timer, the agreed progress) and MAX-reduce
        the votes (`_all_reduce(..., ReduceOp.MAX)` over the attention TP group, one
        collective per poll), so every rank terminates the prefetch at the same poll.
        The first replica to poll ``pid`` in this admission takes every rank's vote
        from its state before the poll and issues the collective once for the group;
        the others reuse the verdict. Which ids each replica polled is kept:
        ``_st_check_votes`` pairs the ranks' calls at the next sync, as SGLang's
        collectives pair them."""
        from sim.storage import policy

        key = (self.sim.step_no, self.env.now)
        if self.vote_at != key:
            self.vote_at = key
            self.votes.clear()
            self.polled.clear()
        self.polled.setdefault(id(c), []).append(pid)
        known = self.votes.get(pid)
        if known is not None:
            return known[0]
        completed = self.completed(pid)
        votes: dict[int, int] = {}
        for c2 in self.group.cohorts:
            p2 = c2.st.book.prefetches.get(pid)
            if p2 is None:
                continue  # `check_prefetch_progress` returns before the vote there
            landed = p2.staged is not None and completed is not None and completed >= p2.staged
            v = int(self.policy.can_terminate(kv_landed=landed, wait=c2.st.waits.get(pid),
                                              now=self.env.now))
            for r in c2.ranks:
                votes[r] = v
        if len(votes) == self.sim.cfg.tp and len(set(votes.values())) == 1:
            v = next(iter(votes.values()))
            red = self.collective.all_reduce_uniform(self.sim.step_no, "prefetch_terminate", [-v])
        else:
            # MAX as the MIN of negated votes; a rank without the prefetch skipped it
            red = self.sim._all_reduce("prefetch_terminate", {r: [-v] for r, v in votes.items()})
        verdict = policy.terminate_consensus([-red[0]])
        self.votes[pid] = (verdict, votes)
        return verdict

    def check_votes(self) -> None:
        """The last admission's timeout votes, paired as SGLang pairs them: each rank's
        n-th `_can_terminate_prefetch` collective meets the others' n-th. Replicas that
        polled the same ids in the same order got exactly the verdicts `_st_vote`
        gave them. Otherwise (another admission order): a rank that entered more
        calls than another blocks in its extra one (a hang, at that admission's step);
        with equal counts, each n-th call's MAX over the ranks' n-th votes must be the
        verdict each rank used, or the ranks acted on verdicts this engine did not
        follow (untracked). The calls were counted once per id polled."""
        polled, votes = self.polled, self.votes
        step, now = self.vote_at
        self.vote_at = None
        seqs = {r: tuple(polled.get(id(c), ())) for c in self.group.cohorts for r in c.ranks}
        polled.clear()
        try:
            if len(set(seqs.values())) == 1:
                return
            most = max(len(x) for x in seqs.values())
            if any(len(x) != most for x in seqs.values()):
                try:
                    self.collective.all_reduce_min(
                        step, "prefetch_terminate",
                        {r: [0] for r, x in seqs.items() if len(x) == most})
                except CollectiveError as err:
                    self.sim._collective_failed(err)
            for n in range(most):
                paired = max(votes[x[n]][1].get(r, 0) for r, x in seqs.items())
                if any(bool(paired) != votes[x[n]][0] for x in seqs.values()):
                    self.sim.obs.untracked(now, step, "ranks polled different prefetches in the "
                                       "timeout vote and their paired collectives gave "
                                       "other verdicts")
                    self.sim.halted = "untracked"
                    raise _Halt()
        finally:
            votes.clear()
