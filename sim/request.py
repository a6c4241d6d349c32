"""A request's state in the engine: across its life (``Req``), on one replica
(``_Slot``), and one replica's half of a prefill batch (``_Plan``); and ``_Halt``,
what stops a run where a real server would stop."""

from __future__ import annotations

import math

class _Halt(Exception):
    """Stops the run where a real server would stop (or the run cannot follow)."""


class _Slot:
    """A request's state on one replica: its lock and its KV."""

    __slots__ = ("lock", "lock_id", "done", "in_tree", "device_hit", "loaded", "inserted")

    def __init__(self):
        self.lock = None       # the locked node
        self.lock_id = None    # that lock's op-trace id (when recording)
        self.done = 0          # tokens whose KV exists while prefilling (prefix + chunks)
        self.in_tree = 0       # leading tokens whose pages the tree owns (page-aligned)
        self.device_hit = 0
        self.loaded = 0
        # `req.kv.cache_inserted_len`: tokens this request inserted (0 again after a
        # retraction, `reset_for_retract`, as the slot is new then)
        self.inserted = 0

    def copy(self) -> "_Slot":
        s = _Slot()
        for k in _Slot.__slots__:
            setattr(s, k, getattr(self, k))
        return s


class Req:
    """A request across its life. Per-replica state lives in ``slots``; the metrics
    fields describe rank 0, the group's reference rank. A retracted request keeps its
    outputs: it prefills its input and those outputs again (``fill_len``)."""

    __slots__ = ("r", "key", "slots", "remaining", "generated", "kv", "retractions",
                 "device_hit", "loaded", "load_s", "stall_s", "prefill_s", "start",
                 "first_token", "finish", "l3")

    def __init__(self, r, key):
        self.r = r
        self.key = key
        self.slots: dict[int, _Slot] = {}  # id(cohort) -> its state
        self.remaining = 0   # decode steps left
        self.generated = 0   # output tokens so far
        self.kv = 0          # committed KV tokens while decoding (`kv_committed_len`)
        self.retractions = 0
        self.device_hit = self.loaded = 0
        self.load_s = self.stall_s = self.prefill_s = 0.0
        self.start = self.first_token = self.finish = math.nan
        self.l3 = 0  # tokens its prefetch loaded from storage (rank 0's replica)

    @property
    def try_suffix(self) -> str:
        """The op-trace id suffix of this admission: ``.t<n>`` after n retractions, so
        a re-admitted request's locks and loads never reuse an earlier try's ids."""
        return f".t{self.retractions}" if self.retractions else ""

    @property
    def fill_len(self) -> int:
        """`full_untruncated_fill_ids`: input plus the outputs so far."""
        return self.r.input_len + self.generated


class _Plan:
    """One replica's half of a prefill batch: what it admitted and what that cost."""

    __slots__ = ("reqs", "shape", "chunks", "backups", "scanned", "loads", "load_tokens",
                 "started", "stall_first")

    def __init__(self):
        self.reqs: list[Req] = []
        self.shape: list[tuple[int, int, int]] = []  # (rid, prefix tokens, extend tokens)
        self.chunks: list[tuple[int, int]] = []      # (new, cached) per request
        self.backups: list[int] = []                 # blocking D2H backups, tokens each
        self.scanned = 0                             # reclaim map entries visited
        self.loads: list = []                        # load-back ids of this batch
        self.load_tokens = 0
        self.started = None                          # event: the merged H2D op began
        self.stall_first = 0.0                       # eviction stall, booked on the first request
