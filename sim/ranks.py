"""A TP group of tree replicas: cohorts, copy-on-divergence, per-rank hardware.

Each TP rank of SGLang holds its own tree, ack queues, copy engines and allocator
(sem §5.1). Ranks whose inputs have been identical so far behave identically, so
they form a *cohort* that shares one tree, one pair of FIFO ack queues and one pair of
copy engines standing for each of its ranks' own. A rank-specific event (an ack it
pops alone, an extra node id, a different admission order) forks that rank off with a
cloned tree; ranks whose hardware differs from the start (a skewed pool, an allocator
that can fail, late frees) get their own replica at t=0. Sharing is bookkeeping only:
every draw is keyed per rank and event (``sim.jitter``), so ``replicas: eager`` (one
tree per rank from t=0) gives byte-identical results.

Ack queues are FIFO, as SGLang's are. A transfer's ack is complete for rank ``r`` at
``done + delay[r]``: ``done`` when the copy engine finishes it, ``delay[r]`` that
rank's CUDA event firing late.
"""

from __future__ import annotations

from collections import deque

import simpy

from sim.allocator import KVAllocator
from sim.config import SimConfig
from sim.constants import LAYER_DONE_COUNTERS
from sim.hybrid.replica import HybridReplica
from sim.jitter import Jitter
from sim.scheduler import SchedState
from sim.tree import Tree



def cohort_of(cohorts, rank: int) -> Cohort:
    """The cohort among ``cohorts`` whose replica stands for ``rank``."""
    for c in cohorts:
        if rank in c.ranks:
            return c
    raise KeyError(rank)

class Ack:
    """One merged transfer's acknowledgement: the tree ack ids it completes."""

    __slots__ = ("kind", "ids", "tokens", "n", "delays", "done", "late")

    def __init__(self, kind: str, ids: list, tokens: int, n: int, delays: dict | None):
        self.kind = kind      # "write" or "load"
        self.ids = ids        # tree ack ids, in issue order
        self.tokens = tokens
        self.n = n            # this kind's sequence number on the ranks that issued it
        self.delays = delays  # rank -> extra delay (s), or None when no rank is delayed
        self.done: float | None = None  # set by the copy engine when the copy finishes
        self.late: dict | None = None   # delayed rank -> the event of its ack being ready

    def ready(self, rank: int, now: float) -> bool:
        """`finish_event.query()` on ``rank``: the copy has ended and, on a delayed
        rank, its delay's timeout has fired (``now``: unused, the events carry it)."""
        if self.done is None:
            return False
        if self.late is None:
            return True
        ev = self.late.get(rank)
        return ev is None or ev.processed


class Cohort:
    """Ranks with identical history: one tree, FIFO ack queues, copy engines."""

    __slots__ = ("ranks", "tree", "write_q", "load_q", "ops", "acks_issued", "h2d", "d2h",
                 "alloc_attempts", "kv", "sched", "st", "consensus",
                 "producers", "producer_index")

    def __init__(self, env: simpy.Environment, ranks: list[int], tree, ops=None,
                 sched: SchedState | None = None):
        self.ranks = ranks
        self.tree = tree
        self.sched = sched if sched is not None else SchedState()  # each rank's scheduler
        self.write_q: deque[Ack] = deque()
        self.load_q: deque[Ack] = deque()
        self.ops = ops  # the op-trace this replica has seen (repro bundles), or None
        self.acks_issued = {"write": 0, "load": 0}
        # Each rank's two copy engines (sem §6.4: dedicated D->H and H->D streams).
        self.h2d = simpy.Resource(env, capacity=1)
        self.d2h = simpy.Resource(env, capacity=1)
        self.alloc_attempts = 0    # host allocation attempts (the key of their draws)
        # the device KV running requests hold outside the tree, and the frees
        # issued (late-free draws) and in flight (sim.allocator)
        self.kv = KVAllocator(tree)
        self.st = None  # the L3 tier's per-replica state (sim.events.StorageState), or None
        self.consensus = None  # the rank consensus checker's event log (sim.consensus), or None
        # LayerDoneCounter's producer slots: the load ack that last used each, and the
        # slot the last load took (`producer_index`, -1 before the first)
        self.producers: list[Ack | None] = [None] * LAYER_DONE_COUNTERS
        self.producer_index = -1

    def shared_ready_count(self, q: deque, now: float) -> int | None:
        """The ready count every rank of the replica sees, or None where an ack with
        per-rank delays is among those that decide it. Without delays an ack is ready
        for every rank or for none, so only the ready acks and the first one that is
        not need looking at, not the whole queue."""
        n = 0
        for ack in q:
            if ack.delays is not None:
                return None
            if not ack.ready(0, now):
                return n
            n += 1
        return n

    def ready_count(self, q: deque, rank: int, now: float) -> int:
        """`_count_ready_acks`: ready acks from the front, up to the first that is not."""
        n = 0
        for ack in q:
            if not ack.ready(rank, now):
                break
            n += 1
        return n

    @property
    def label(self) -> str:
        return ",".join(map(str, self.ranks))


class RankGroup:
    """The TP group: its cohorts, the fork log, and the ranks' rank-local state."""

    def __init__(self, cfg: SimConfig, env: simpy.Environment, jitter: Jitter):
        self.cfg = cfg
        self.env = env
        self.tp = cfg.tp
        self.jitter = jitter
        self.forks: list[dict] = []  # bookkeeping (never in results: see module doc)
        self.merges: list[dict] = []  # identical replicas merged back (sim.coalesce)
        self.retired: list[Cohort] = []  # merged-away cohorts: their ids stay unique
        base = self._make_tree()
        self.cohorts: list[Cohort] = [Cohort(env, list(range(cfg.tp)), base,
                                             ops=[] if cfg.record_ops else None,
                                             sched=SchedState(cfg.schedule_conservativeness))]
        if cfg.rank_consensus:
            self.cohorts[0].consensus = []
        # ranks whose replica carries their own hardware's hooks or a scripted fault
        self.pinned = (set(cfg.jitter.physical_ranks(cfg.tp))
                       | {f[0] for f in cfg.faults if f[0] < cfg.tp})
        own = range(1, cfg.tp) if cfg.replicas == "eager" else sorted(self.pinned)
        for r in own:
            if r < cfg.tp and cfg.tp > 1:
                self.fork(r, "replica", 0.0)
        for c in self.cohorts:
            self._apply_physical(c)

    # ---------------------------------------------------------------- trees
    def _make_tree(self):
        cfg = self.cfg
        if cfg.hybrid is not None:
            return HybridReplica(cfg.hybrid, cfg)
        return Tree(device_capacity=cfg.device_tokens, host_capacity=cfg.host_tokens,
                    page_size=cfg.page_size, write_policy=cfg.write_policy,
                    host_policy=cfg.host_policy, eviction_policy=cfg.eviction_policy,
                    load_back_threshold=cfg.load_back_threshold, ids=cfg.ids)

    def _apply_physical(self, c: Cohort) -> None:
        """Rank-local hardware of a single-rank cohort (applied once, at t=0)."""
        j = self.jitter
        if len(c.ranks) != 1:
            return
        r = c.ranks[0]
        if r in j.host_skew:
            c.tree.host_capacity = max(0, self.cfg.host_tokens + j.host_skew[r])
            if (c.tree.host_capacity != self.cfg.host_tokens
                    and not isinstance(c.tree, HybridReplica)):
                c.tree.host_nominal = self.cfg.host_tokens
                c.tree.host_skew_fired = lambda p=j.perturbations: p.fire("host_capacity_skew")
        if r in j.device_skew:
            c.tree.device_capacity = max(0, self.cfg.device_tokens + j.device_skew[r])
        if r in j.alloc_ranks:
            fired = j.perturbations

            def fail(c=c, r=r) -> bool:
                n = c.alloc_attempts
                c.alloc_attempts += 1
                if j.host_alloc_fails(r, n):
                    fired.fire("host_alloc_failure")
                    return True
                return False

            c.tree.host_alloc_fail = fail

    def cohort_of(self, rank: int) -> Cohort:
        return cohort_of(self.cohorts, rank)

    def fork(self, rank: int, cause: str, now: float, detail: str = "") -> Cohort:
        """Copy-on-divergence: give ``rank`` its own replica from here on. Its copy
        engines start as busy as the cohort's: a shadow holds each new engine until
        the work queued on the old one before the fork has drained."""
        c = self.cohort_of(rank)
        if len(c.ranks) == 1:
            return c
        c.ranks.remove(rank)
        maps: dict = {}
        new = Cohort(self.env, [rank], c.tree.clone(maps),
                     list(c.ops) if c.ops is not None else None, c.sched.copy())
        if c.st is not None:
            new.st = c.st.fork(self.env, new.tree, maps)
            for old_e, new_e in ((c.st.read, new.st.read), (c.st.write, new.st.write)):
                if old_e.count or old_e.queue:
                    self.env.process(_shadow(old_e, new_e))
        new.write_q = deque(c.write_q)  # the same Ack objects: one copy, per-rank readiness
        new.load_q = deque(c.load_q)
        new.acks_issued = dict(c.acks_issued)
        new.alloc_attempts = c.alloc_attempts
        new.kv = c.kv.fork(new.tree)
        new.producers, new.producer_index = list(c.producers), c.producer_index
        if c.consensus is not None:
            new.consensus = list(c.consensus)
        for old_e, new_e in ((c.h2d, new.h2d), (c.d2h, new.d2h)):
            if old_e.count or old_e.queue:
                self.env.process(_shadow(old_e, new_e))
        self.cohorts.append(new)
        self.cohorts.sort(key=lambda x: x.ranks[0])
        self.forks.append({"t": now, "rank": rank, "cause": cause, "detail": detail})
        return new

    # ---------------------------------------------------------------- acks
    def make_ack(self, c: Cohort, kind: str, ids: list, tokens: int) -> Ack:
        n = c.acks_issued[kind]
        c.acks_issued[kind] = n + 1
        delays = self.jitter.ack_delays(kind, n)
        if delays is not None:
            delays = {r: d for r, d in delays.items() if d > 0 and r in c.ranks} or None
        return Ack(kind, ids, tokens, n, delays)


class GroupView:
    """One lane's share of the TP group (sim.lanes): its own cohorts; everything else,
    forks included, is the whole group's, so a replica forked in a lane is both."""

    def __init__(self, whole: RankGroup, cohorts: list[Cohort]):
        self.whole = whole
        self.cohorts = cohorts

    def __getattr__(self, name):
        return getattr(self.whole, name)

    def cohort_of(self, rank: int) -> Cohort:
        return cohort_of(self.cohorts, rank)

    def fork(self, rank: int, cause: str, now: float, detail: str = "") -> Cohort:
        new = self.whole.fork(rank, cause, now, detail)
        if new not in self.cohorts:
            self.cohorts.append(new)
            self.cohorts.sort(key=lambda x: x.ranks[0])
        return new


def _shadow(old: simpy.Resource, new: simpy.Resource):
    """Hold ``new`` until ``old`` has served everything queued on it so far."""
    with new.request() as mine:
        yield mine
        with old.request() as theirs:
            yield theirs


def log_alloc_failures(c: Cohort, on_fail=None) -> list:
    """Record ``c``'s failed host allocations as ``[op index, attempt]`` pairs (the
    op-trace header's ``host_alloc_failures``, docs/OPTRACE.md) and return the list.

    The engine records an op before applying it, so the op being applied is the last
    one recorded (output index ``len(c.ops)``); attempts count from 0 within it. Only
    single-rank replicas built at t=0 draw failures (``RankGroup._apply_physical``).
    ``on_fail(op_index, attempt)`` is called at each failure."""
    draw = c.tree.host_alloc_fail
    log: list = []
    if draw is None or c.ops is None:
        return log
    cur = [-1, 0]  # the op index being applied, the next attempt within it

    def fail() -> bool:
        i = len(c.ops)
        if cur[0] != i:
            cur[0], cur[1] = i, 0
        a = cur[1]
        cur[1] += 1
        failed = draw()
        if failed:
            log.append([i, a])
            if on_fail is not None:
                on_fail(i, a)
        return failed

    c.tree.host_alloc_fail = fail
    return log
