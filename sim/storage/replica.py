"""One replica's L3 state in the engine (docs/STORAGE.md §7): its PrefetchBook, its
storage view, its storage engines (SimPy resources: one for reads, queries included,
one for writes, as SGLang's prefetch and backup threads), the ready queues the sync
vector counts, and the storage ops in flight.

A storage op in flight (``StorageOp``) may be shared by several replicas: a fork
copies the in-flight set, and when the op finishes every replica holding it gets the
result (the ranks forked after it began saw it begin).
"""

from __future__ import annotations

from collections import deque

import simpy

from sim.storage.prefetch import PrefetchBook
from sim.storage.view import StorageView


class StorageOp:
    """A query, a prefetch transfer or a storage write in flight."""

    __slots__ = ("kind", "id", "keys", "pages", "completed", "cancelled")

    def __init__(self, kind: str, oid, keys=None, pages: int = 0):
        self.kind = kind          # "query", "read" or "write"
        self.id = oid             # prefetch id or storage write id
        self.keys = keys          # page keys (query: the prefetch key; write: the node's)
        self.pages = pages        # pages moved (read, write)
        self.completed = 0        # tokens landed so far (read)
        self.cancelled = False    # the prefetch terminated: the transfer stops


class StorageState:
    __slots__ = ("book", "view", "read", "write", "hit_q", "ack_q", "wack_q",
                 "inflight", "xfers", "waits", "n_writes", "qkeys", "calls", "chain")

    def __init__(self, env: simpy.Environment, book: PrefetchBook, view: StorageView):
        self.book = book
        self.view = view
        self.read = simpy.Resource(env, capacity=1)   # the rank's prefetch I/O
        self.write = simpy.Resource(env, capacity=1)  # the rank's backup I/O
        self.hit_q: deque = deque()    # prefetch_hit_queue: (pid, hit tokens)
        self.ack_q: deque = deque()    # ack_prefetch_queue: pids whose transfer finished
        self.wack_q: deque = deque()   # ack_backup_queue: storage write ids
        self.inflight: set = set()     # StorageOps whose result this replica awaits
        self.xfers: dict = {}          # pid -> its read StorageOp (after the hit)
        self.waits: dict = {}          # pid -> policy.PrefetchWait
        self.n_writes = 0              # the auto storage-write ids issued (s1, s2, ...)
        self.qkeys: dict = {}          # pid -> its queried page keys, until the hit drains
        self.calls = 0                 # storage calls begun (the key of latency draws)
        # node id -> the storage key of the last page of that node's path (a node's
        # path never changes, a split keeps the lower node's id, ids are never reused)
        self.chain: dict = {}

    def queue_sizes(self) -> tuple[int, int, int, int]:
        """``(prefetch_hit, ack_prefetch, ack_backup, host_mem_release)``: staged tails
        are released at ``done`` here, so the release queue is always empty."""
        return len(self.hit_q), len(self.ack_q), len(self.wack_q), 0

    def held_ids(self) -> set:
        """Every prefetch id this replica still holds: in its book, its hit or ack
        queue, its transfers, waits or queried keys, or an op it awaits
        (``StorageEngine.sweep``)."""
        return set().union(self.book.held_ids(), self.hit_q, self.ack_q, self.xfers,
                           self.waits, self.qkeys, (op.id for op in self.inflight))

    def busy(self) -> bool:
        return bool(self.book.prefetches or self.book.writes or self.hit_q
                    or self.ack_q or self.wack_q)

    def fork(self, env: simpy.Environment, tree, maps: dict) -> "StorageState":
        new = StorageState(env, self.book.clone(tree, maps), self.view.copy())
        new.hit_q, new.ack_q, new.wack_q = deque(self.hit_q), deque(self.ack_q), deque(self.wack_q)
        new.inflight = set(self.inflight)
        new.xfers = dict(self.xfers)
        new.waits = {k: type(w)(w.timeout_s, w.started_at, w.expired) for k, w in self.waits.items()}
        new.n_writes = self.n_writes
        new.qkeys = dict(self.qkeys)
        new.calls = self.calls
        new.chain = dict(self.chain)  # the clone keeps every node's id and path
        return new
