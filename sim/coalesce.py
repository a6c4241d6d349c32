"""Copy-on-divergence's other half: replicas that have become identical again merge.

A cohort forks off when one of its ranks sees something the others do not (an ack
it pops alone, an admission order, ``engine.replicas: eager``'s one tree per rank at
t=0). Many of those differences are transient: the other ranks pop the same ack a
step later, and from then on every replica makes the same decisions again. Kept
apart, each still pays for every match, insert and eviction, and a decode run stops
at every step while more than one replica exists (``sim.decode``). Merged, the
simulator's cost follows how far the ranks differ *now*, not how many ever forked.

Two cohorts merge only when everything their future depends on is the same:

- their trees, compared as object graphs (``Iso.same``): every node's key, ids,
  locks, tiers, LRU stamps and list links, the leaf sets, the duplicate map in its
  order, in-flight writes and load-backs, counters, stats and the digest. Nothing is
  left out by a hand-kept field list: a field added to a node is compared the day it
  is added;
- their scheduler state, device KV allocator, ack counters, LayerDoneCounter slots,
  op-traces and consensus logs;
- their ack queues, ack by ack (the same transfer, sequence number and end), with
  both copy engines idle, so no copy of one is still in flight;
- every live request's slot on each (its lock maps to the corresponding node), the
  write acks waiting to be flushed and the result scans not yet charged.

A rank with its own hardware (``sim.config.JitterConfig.physical_ranks``, a scripted
fault) never merges: its tree carries that rank's hooks. Nor do replicas under lanes
(per-rank request state) or the step recorder, whose per-replica state lives outside
the cohort. A hybrid replica (``sim.hybrid.replica``) is one object graph like a FULL
tree, its pools and request states included. With the storage tier, a replica's
storage state (``StorageState``: prefetch book, storage view, queues, call counts;
buffer_only's staging buffer) is part of the graph, its hooks are objects that name
their replica (``sim.storage.engine.ReplicaHook``), and a replica merges only with
no storage call, prefetch or write in flight.

A cheap signature (digest, content hash, ledgers, queue lengths) picks candidates
each iteration; the full comparison runs only on a match, and a pair that fails it
waits twice as many steps before the next try, so a lasting difference the
signature cannot see costs O(log steps) comparisons, not one per step. A rank that
forks again within a few steps of a merge (a rank whose acks keep landing late)
waits before its next merge, twice as long each time it happens again: a fork is a
clone and a merge a comparison, both O(tree), and churning between them costs more
than keeping the replica apart.

Merging is bookkeeping, as forking is: ``Simulation.coalesce_replicas = False`` runs
the plain path, and the tests compare the two byte for byte.
"""

from __future__ import annotations

from collections import deque
from operator import attrgetter
from types import BuiltinFunctionType, FunctionType, MethodType, ModuleType

from sim.ranks import Ack, Cohort
from sim.tree.core import Stats

_ATOMS = frozenset((int, float, str, bool, bytes, type(None), complex))
# What a graph walk may meet only as one shared object (identity, never structure).
_OPAQUE = (FunctionType, BuiltinFunctionType, type, ModuleType)
_MAX_GAP = 1 << 12  # steps between two tries of a pair that keeps failing
_SHORT = 16         # a merge that lasted fewer steps than this did not pay
_MAX_SCAN = 64      # steps between two scans at most


class Iso:
    """Two object graphs walked in step: ``same`` is True when they are equal up to
    a one-to-one renaming of their objects. The renaming (``fwd``) carries over
    between calls, so a request's lock compares against the node the trees paired.
    Distinct but equal acks are collected in ``acks`` for the merge to unite."""

    __slots__ = ("fwd", "back", "sets", "acks")

    def __init__(self):
        self.fwd: dict[int, object] = {}
        self.back: dict[int, object] = {}
        self.sets: list = []
        self.acks: list[tuple[Ack, Ack]] = []

    def _pair(self, x, y) -> bool | None:
        """Record ``x -> y``; False on a clash, True if already paired, None if new."""
        m = self.fwd.get(id(x))
        if m is not None:
            return m is y
        if id(y) in self.back:
            return False
        self.fwd[id(x)] = y
        self.back[id(y)] = x
        return None

    def same(self, a, b) -> bool:
        stack = [(a, b)]
        pop, push = stack.pop, stack.append
        atoms = _ATOMS
        while stack:
            x, y = pop()
            tx = type(x)
            if tx in atoms:
                if type(y) is not tx or x != y:
                    return False
                continue
            if x is y:  # one object both graphs hold: nothing to walk, but one name
                if self._pair(x, x) is False:
                    return False
                continue
            if type(y) is not tx:
                return False
            seen = self._pair(x, y)
            if seen is False:
                return False
            if seen:
                continue
            if tx is list or tx is tuple or tx is deque:
                if len(x) != len(y):
                    return False
                if set(map(type, x)) <= atoms:
                    if x != y:
                        return False
                    continue
                stack.extend(zip(x, y))
            elif tx is dict:
                if len(x) != len(y):
                    return False
                for (kx, vx), (ky, vy) in zip(x.items(), y.items()):  # order matters too
                    push((kx, ky))
                    push((vx, vy))
            elif tx is set or tx is frozenset:
                if len(x) != len(y):
                    return False
                self.sets.append((x, y))
            elif tx is MethodType:
                if x.__func__ is not y.__func__:
                    return False
                push((x.__self__, y.__self__))
            elif tx is Ack:
                # the same transfer on both, ended; each holds its own ranks' delays
                if (x.kind != y.kind or x.ids != y.ids or x.tokens != y.tokens
                        or x.n != y.n or x.done is None or x.done != y.done):
                    return False
                self.acks.append((x, y))
            elif isinstance(x, _OPAQUE):
                return False  # two different functions or classes
            else:
                names, skip, get, has_dict = _fields(tx)
                if has_dict:
                    dx, dy = x.__dict__, y.__dict__
                    if dx.keys() != dy.keys():
                        return False
                    for k, v in dx.items():
                        if k not in skip:
                            push((v, dy[k]))
                if get is not None:
                    try:
                        vx, vy = get(x), get(y)
                    except AttributeError:  # a slot never set: one by one below
                        get = None
                    else:
                        for p, q in zip(vx, vy):
                            if p is not q:  # the same small int, None or bool: equal
                                push((p, q))
                if get is None:
                    for k in names:
                        push((getattr(x, k, _UNSET), getattr(y, k, _UNSET)))
        return self._sets_agree()

    def _sets_agree(self) -> bool:
        """Sets (the leaf sets) last, once their members have been paired."""
        sets, self.sets = self.sets, []
        for x, y in sets:
            ys = {id(e) for e in y}
            for e in x:
                if type(e) in _ATOMS:
                    if e not in y:
                        return False
                    continue
                m = self.fwd.get(id(e))
                if m is None or id(m) not in ys:
                    return False
        return True


class _Unset:
    __slots__ = ()


_UNSET = _Unset()
_FIELD_CACHE: dict[type, tuple] = {}


def _fields(tx: type) -> tuple:
    """Every slot a class and its bases declare, less its ``scratch_fields`` (a
    per-call result the next call rewrites before anything reads it); those; a
    getter of all the slots' values as one tuple (None without two or more); and
    whether its instances have a ``__dict__``."""
    got = _FIELD_CACHE.get(tx)
    if got is None:
        skip = frozenset(getattr(tx, "scratch_fields", ()))
        names: list[str] = []
        for k in tx.__mro__:
            for s in getattr(k, "__slots__", ()):
                if s not in ("__dict__", "__weakref__") and s not in names and s not in skip:
                    names.append(s)
        get = attrgetter(*names) if len(names) > 1 else None
        # instances with a __dict__ (a class without __slots__ somewhere in its line)
        has_dict = any("__dict__" in vars(k) for k in tx.__mro__ if k is not object)
        got = _FIELD_CACHE[tx] = (tuple(names), skip, get, has_dict)
    return got


def _engines_idle(c: Cohort) -> bool:
    """No copy on either engine and, with the storage tier, no storage call, prefetch,
    write or queued result: nothing in flight that a SimPy process of this replica's
    still has to deliver."""
    if c.h2d.count or c.h2d.queue or c.d2h.count or c.d2h.queue:
        return False
    st = c.st
    return st is None or not (st.busy() or st.inflight or st.xfers or st.waits
                              or st.read.count or st.read.queue
                              or st.write.count or st.write.queue)


_stats = attrgetter(*Stats.__slots__)


def signature(c: Cohort) -> tuple:
    """What two mergeable cohorts certainly share, in O(1): the ledgers, counters
    and queue lengths a transient difference leaves behind most often."""
    t = c.tree  # through the replica interface (sim.replica_api) only
    return (_stats(t.stats), t.digest, t.digest_xor, t.content_hash, t.dev_used, t.host_used,
            t.n_nodes, t.reserved, len(c.write_q), len(c.load_q),
            c.acks_issued["write"], c.acks_issued["load"], c.alloc_attempts,
            c.producer_index, c.sched.ratio, c.sched.batch_is_full,
            -1 if c.ops is None else len(c.ops))


class Coalescer:
    """Merges a TP group's identical cohorts back into one (``Simulation``'s)."""

    __slots__ = ("sim", "pinned", "backoff", "merged_at", "hold", "seen", "next_scan",
                 "interval")

    def __init__(self, sim, pinned: set[int]):
        self.sim = sim
        self.pinned = pinned      # ranks with their own hardware or faults: never merged
        self.backoff: dict[tuple[int, int], tuple[int, int]] = {}  # pair -> (next step, gap)
        # A rank that forks again soon after a merge paid a clone and a comparison
        # for little: it waits before its next merge, twice as long each time.
        self.merged_at: dict[int, int] = {}            # rank -> step of its last merge
        self.hold: dict[int, tuple[int, int]] = {}     # rank -> (next step, gap)
        self.seen = 0                                  # forks already looked at
        # A scan that merges nothing doubles the steps to the next one (a fork or a
        # merge brings it back to every step): lasting differences cost a scan now
        # and then, not one per step.
        self.next_scan = 0
        self.interval = 1

    def _forked(self, step: int) -> None:
        """Holds for the ranks that forked since the last look."""
        forks = self.sim.group.forks
        for f in forks[self.seen:]:
            r = f["rank"]
            at = self.merged_at.pop(r, None)
            if at is None:
                continue
            if step - at < _SHORT:
                gap = min(_MAX_GAP, 2 * self.hold[r][1]) if r in self.hold else _SHORT
                self.hold[r] = (step + gap, gap)
            else:
                self.hold.pop(r, None)
        self.seen = len(forks)

    def step(self) -> None:
        """Merge every cohort that equals an earlier one (an iteration's start)."""
        sim = self.sim
        group = sim.group
        if len(group.cohorts) < 2 or sim._lanes is not None or sim.steprec is not None:
            return
        step = sim.step_no
        if len(group.forks) > self.seen:
            self._forked(step)
            self.interval = 1
        elif step < self.next_scan:
            return
        merged = len(group.merges)
        hold = self.hold
        by_sig: dict[tuple, list[Cohort]] = {}
        for c in group.cohorts:
            if self.pinned.intersection(c.ranks) or not _engines_idle(c):
                continue
            if hold and any(hold.get(r, (0,))[0] > step for r in c.ranks):
                continue
            by_sig.setdefault(signature(c), []).append(c)
        for same in by_sig.values():
            if len(same) < 2:
                continue
            reps: list[Cohort] = []
            for c in same:
                for rep in reps:
                    if self._try(rep, c):
                        break
                else:
                    reps.append(c)
        self.interval = 1 if len(group.merges) > merged else min(_MAX_SCAN, 2 * self.interval)
        self.next_scan = step + self.interval

    def _try(self, a: Cohort, b: Cohort) -> bool:
        key = (id(a), id(b))
        step = self.sim.step_no
        due = self.backoff.get(key)
        if due is not None and step < due[0]:
            return False
        iso = self._same(a, b)
        if iso is None:
            gap = min(_MAX_GAP, 2 * due[1]) if due is not None else 1
            self.backoff[key] = (step + gap, gap)
            return False
        self.backoff.pop(key, None)
        self._merge(a, b, iso)
        return True

    def _same(self, a: Cohort, b: Cohort) -> Iso | None:
        """The pairing under which ``b``'s whole state is ``a``'s, or None."""
        sim = self.sim
        if a.ops != b.ops or a.consensus != b.consensus:
            return None
        iso = Iso()
        # A reference back to the replica itself (a storage hook's) names its pair.
        iso._pair(a, b)
        if not iso.same((a.tree, a.kv, a.sched, a.acks_issued, a.alloc_attempts,
                         a.producers, a.producer_index, list(a.write_q), list(a.load_q), a.st),
                        (b.tree, b.kv, b.sched, b.acks_issued, b.alloc_attempts,
                         b.producers, b.producer_index, list(b.write_q), list(b.load_q), b.st)):
            return None
        ia, ib = id(a), id(b)
        if sim._result_scans.get(ia) != sim._result_scans.get(ib):
            return None
        if not iso.same(sim._pending_writes.get(ia), sim._pending_writes.get(ib)):
            return None
        for rq in sim._live():
            sa, sb = rq.slots.get(ia), rq.slots.get(ib)
            if (sa is None) != (sb is None):
                return None
            if sa is not None and not iso.same(sa, sb):
                return None
        return iso

    def _merge(self, a: Cohort, b: Cohort, iso: Iso) -> None:
        """``b``'s ranks join ``a``: ``a``'s acks take on their delays. ``b`` is kept
        as an empty shell (retired) so that its id, a key of per-replica maps, is
        never reused; what it held is let go."""
        sim, group = self.sim, self.sim.group
        for x, y in iso.acks:
            if y.delays:
                x.delays = {**(x.delays or {}), **y.delays}
            if y.late:
                x.late = {**(x.late or {}), **y.late}
        a.ranks = sorted(a.ranks + b.ranks)
        for r in a.ranks:
            self.merged_at[r] = sim.step_no
        group.cohorts.remove(b)
        group.retired.append(b)
        ib = id(b)
        sim._result_scans.pop(ib, None)
        sim._pending_writes.pop(ib, None)
        for rq in sim._live():
            rq.slots.pop(ib, None)
        group.merges.append({"t": sim.env.now, "ranks": list(b.ranks), "into": a.ranks[0]})
        if sim._st is not None:
            sim._st.polled.pop(ib, None)
        b.tree = b.kv = b.ops = b.consensus = b.st = None
        b.write_q, b.load_q, b.producers = deque(), deque(), []
